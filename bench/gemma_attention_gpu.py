"""The attention paths of a Gemma-3-270M-shaped target and draft on a GPU, at random weights.

    python bench/gemma_attention_gpu.py [--tokens 700] [--out FILE.json]

Gemma-3-270M (one KV head, head_dim 256, a 512-token sliding window on five layers of six) is
where a trained DFlash draft was served at τ 1.000 and the block drafts' evaluation hit a
device-side assert on an H200, while a draft of the same kind trains and serves consistently on a
CPU (docs/results/families_h200.md). What runs only on a GPU is checked here, one path at a time,
against a reference that shares nothing with it. No weights or tokenizer are needed: the target
is transformers' Gemma3 built from the 270M config with random weights, which exercises the same
kernels at the same shapes.

1. Target captures (bf16), each against the target's serving forward with SDPA's math kernel
   (the reference): training's eager capture (target/sdpa.py's backends, no cuDNN), training's
   bucketed capture through CUDA graphs (target/bucketed.py), and the serving forward
   (`forward_static`: a prefill, then verify-sized pieces) with every SDPA backend allowed
   (cuDNN's fused attention first on Hopper), with cuDNN excluded, and with cuDNN alone. Also the
   share of positions where the serving logits' argmax differs from the reference's.
2. The draft's training attention (models/layers.py: SDPA under a block mask, K/V repeated to the
   query heads) at head_dim 256: the memory-efficient kernel against math, forward and gradients.
3. The split-KV decode kernel (target/native/attention_kernel.py), compiled, against its PyTorch
   reference at head_dim 256, for the draft's block (16 queries x 4 heads over 1 KV head) and a
   verify, bf16 and float32.
4. A random DFlash-shaped draft with a 32K draft vocabulary over the serving captures: the
   reference round's first tokens against the engine drafter's (kernel and SDPA), and the count
   of non-finite hidden states and logits on each path.
Glossary: T tokens, m·D captured width, hd head dim, γ block size.
"""

from __future__ import annotations

import argparse
import json
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from capture_paths import engine_first_tokens, first_tokens, rel  # bench/, beside this script
from splitserve.config import DraftConfig, TargetConfig
from splitserve.models.build import build_draft, resolve_arch
from splitserve.models.vocab_map import VocabMap
from splitserve.target.bucketed import BucketedCapture
from splitserve.target.hf import wrap_hf_model
from splitserve.target.native import attention as attention_ref
from splitserve.target.native.attention_kernel import decode_attention, decode_attention_triton
from splitserve.target.sdpa import varlen_sdpa

# Gemma-3-270M's text config (its config.json), the fields that shape the computation.
GEMMA3_270M = dict(
    vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
    num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=512, max_position_embeddings=32768,
    rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", attn_logit_softcapping=None,
    final_logit_softcapping=None, tie_word_embeddings=True,
    layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3,
    rope_parameters={"full_attention": {"rope_theta": 1e6, "rope_type": "default"},
                     "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}},
)
LAYER_IDS = [1, 5, 8, 12, 15]  # the spread rule's five layers on 18 (what the GPU run captured)


def backends(name: str):
    return {"default": nullcontext, "no_cudnn": varlen_sdpa,
            "cudnn_only": lambda: sdpa_kernel([SDPBackend.CUDNN_ATTENTION]),
            "math": lambda: sdpa_kernel([SDPBackend.MATH])}[name]()


def serving(target, ids: torch.Tensor, piece: int, prefill: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """ids (1, T) -> aux (1, T, m·D) and logits (1, T, V) of forward_static, prefill then pieces."""
    t = ids.shape[1]
    cache = target.new_static_cache(t + piece)
    pos = torch.arange(t, device=ids.device)
    auxes, logits, p = [], [], 0
    while p < t:
        n = prefill if p == 0 else min(piece, t - p)
        lg, cap = target.forward_static(ids[:, p:p + n], cache, pos[p:p + n])
        auxes.append(cap.aux)
        logits.append(lg)
        p += n
    return torch.cat(auxes, 1), torch.cat(logits, 1)


@torch.no_grad()
def check_target(target, ids: torch.Tensor, piece: int) -> dict:
    with backends("math"):
        ref_aux, ref_logits = serving(target, ids, piece)
    ref_top = ref_logits.argmax(-1)
    out = {"aux_max_abs": float(ref_aux.abs().max())}
    with varlen_sdpa():
        out["training_eager_vs_ref"] = rel(target.capture(ids).aux, ref_aux)
    bucketed = BucketedCapture(target, max_len=2048, use_graphs=ids.is_cuda)
    out["training_bucketed_graphs_vs_ref"] = rel(bucketed(ids[0]).aux, ref_aux)
    for name in ("default", "no_cudnn", "cudnn_only"):
        try:
            with backends(name):
                aux, logits = serving(target, ids, piece)
            out[f"serving_{name}_vs_ref"] = rel(aux, ref_aux)
            out[f"serving_{name}_argmax_differs"] = float((logits.argmax(-1) != ref_top).float().mean())
        except RuntimeError as exc:  # cuDNN may refuse a shape: say so, do not stop
            out[f"serving_{name}_vs_ref"] = f"refused: {str(exc).splitlines()[0][:160]}"
    return out


def check_training_attention(dev: torch.device, hd: int = 256, seed: int = 0) -> dict:
    """SDPA as the draft's training attention calls it (bool mask, K/V repeated): efficient vs math."""
    g = torch.Generator(device=dev).manual_seed(seed)
    b, h, q_len, c = 4, 4, 512, 1024
    q = torch.randn(b, h, q_len, hd, device=dev, generator=g, dtype=torch.bfloat16)
    k = torch.randn(b, 1, c + q_len, hd, device=dev, generator=g, dtype=torch.bfloat16).repeat_interleave(h, 1)
    v = torch.randn(b, 1, c + q_len, hd, device=dev, generator=g, dtype=torch.bfloat16).repeat_interleave(h, 1)
    # each query sees a context prefix of its own length plus its block of 16 (the packing's shape)
    ctx_len = torch.randint(1, c, (b, q_len // 16), device=dev, generator=g).repeat_interleave(16, 1)  # (B, Q)
    slot = torch.arange(c + q_len, device=dev)
    block = torch.arange(q_len, device=dev) // 16
    mask = (slot[None, None] < ctx_len[..., None]) | (
        (slot[None, None] >= c) & ((slot[None, None] - c) // 16 == block[None, :, None]))
    mask = mask[:, None]  # (B, 1, Q, C+Q)
    res = {}
    grads = {}
    for name, ctx in (("math", backends("math")), ("training", varlen_sdpa())):
        qq, kk, vv = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
        with ctx:
            o = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask)
        o.float().square().sum().backward()
        grads[name] = (o.detach(), qq.grad, kk.grad, vv.grad)
    for i, part in enumerate(("out", "dq", "dk", "dv")):
        res[f"training_attention_{part}_vs_math"] = rel(grads["training"][i], grads["math"][i])
    return res


def check_decode_kernel(dev: torch.device) -> dict:
    res = {}
    for dtype in (torch.float32, torch.bfloat16):
        for T, G, window, last, sw in ((16, 4, 1041, 700, None), (17, 4, 1041, 1000, 512), (1, 4, 1041, 1000, 512)):
            g = torch.Generator(device=dev).manual_seed(T)
            q = torch.randn(T, G, 256, device=dev, generator=g).to(dtype)
            k = torch.randn(1, window, 256, device=dev, generator=g).to(dtype)
            v = torch.randn(1, window, 256, device=dev, generator=g).to(dtype)
            pos = torch.full((T,), last, device=dev) if T == 16 else torch.arange(last - T + 1, last + 1, device=dev)
            want = attention_ref.decode_attention(q.float(), k.float(), v.float(), pos, window, 256 ** -0.5, sw)
            got = decode_attention_triton(q, k, v, pos, window, 256 ** -0.5, sw)
            res[f"decode_kernel_T{T}_{str(dtype)[6:]}_vs_ref"] = rel(got, want)
    return res


@torch.no_grad()
def check_draft(target, ids: torch.Tensor, aux: torch.Tensor, dev: torch.device) -> dict:
    """A random DFlash-shaped draft (γ=16, no Markov head, 32K draft vocabulary) over `aux`."""
    torch.manual_seed(0)
    arch = resolve_arch(DraftConfig(num_layers=2, block_size=16, markov_rank=0, enable_confidence_head=False,
                                    draft_vocab_size=32000), target.info, target.config, None)
    draft = build_draft(arch, target).to(dev, torch.bfloat16).eval()
    used = torch.randperm(arch.vocab_size)[:32000]
    draft.set_vocab(VocabMap.from_ids(used, arch.vocab_size))
    anchors = list(range(200, ids.shape[1] - 20, 37))
    _, ref_tokens = first_tokens(draft, ids, aux, anchors)  # the reference round (draft.draft)
    out = {"anchors": len(anchors)}
    for kind, attend in (("kernel", decode_attention), ("sdpa", None)):
        got, out[f"engine_{kind}_nonfinite_h"], out[f"engine_{kind}_nonfinite_logits"] = engine_first_tokens(
            draft, ids, aux, anchors, attend)
        out[f"engine_{kind}_same_as_reference_round"] = sum(a == b for a, b in zip(got, ref_tokens))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=700, help="sequence length (past the 512-token sliding window)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--target", default=None,
                    help="the real target instead (e.g. gemma3-270m): its weights, and a held-out prompt from "
                         "--prompts followed by its own greedy reply as the sequence")
    ap.add_argument("--prompts", default="chitchat")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    dev = torch.device(args.device)
    torch.manual_seed(0)
    if args.target:  # real weights: real activations (Gemma's reach about 1e5)
        from splitserve.data import ChatTemplate, encode_prompt, read_prompts, resolve_prompts_path
        from splitserve.speculative.decode import target_decode
        from splitserve.target import load_target

        target = load_target(TargetConfig(path=args.target, dtype="bfloat16", layer_ids=LAYER_IDS), dev)
        prompt = encode_prompt(target.tokenizer, read_prompts(resolve_prompts_path(args.prompts))[0], ChatTemplate())
        with varlen_sdpa():
            reply = target_decode(target, list(prompt), max(args.tokens - len(prompt), 1))
        ids = torch.tensor([list(prompt) + reply], device=dev)
    else:
        config = Gemma3TextConfig(**GEMMA3_270M, attn_implementation="sdpa")
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(dev)
        target = wrap_hf_model(model, TargetConfig(name="gemma3-270m-shape", path="gemma3-270m-shape",
                                                   layer_ids=LAYER_IDS), name="gemma3-270m-shape")
        ids = torch.randint(10, 100_000, (1, args.tokens), device=dev,
                            generator=torch.Generator(device=dev).manual_seed(1))
    result = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
              "torch": torch.__version__, "cudnn": torch.backends.cudnn.version() if dev.type == "cuda" else None,
              "tokens": ids.shape[1], "weights": args.target or "random"}
    import transformers
    result["transformers"] = transformers.__version__
    for name, fn in (("target", lambda: check_target(target, ids, 17)),
                     ("training_attention", lambda: check_training_attention(dev)),
                     ("decode_kernel", lambda: check_decode_kernel(dev) if dev.type == "cuda" else {})):
        result[name] = fn()
        print(name, json.dumps(result[name]), flush=True)
    with backends("default"):
        aux, _ = serving(target, ids, 17)
    result["draft"] = check_draft(target, ids, aux, dev)
    print("draft", json.dumps(result["draft"]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
