"""Do training and serving see the same target? One target, three ways of capturing its hidden states.

    python bench/capture_paths.py --target gemma3-270m [--draft RUN_DIR] [--prompts FILE] [--device cuda]
        [--dtype bfloat16] [--num-prompts 4] [--out FILE.json]

A draft learns from the captures of training (target/bucketed.py: samples padded to a length
bucket, several per forward, replayed as CUDA graphs on a GPU) and is served on the captures of
the engine's target forward (forward_static over a preallocated cache, prefill then verify-sized
pieces). If the two differ, a draft that trains well drafts badly, and nothing on the training
side shows it. Per prompt (a held-out chat and the target's own greedy reply to it, so contexts
run past a sliding window), this prints the largest difference of each path's captured hidden
states from the eager capture, relative to their largest magnitude, and the serving path once more
with cuDNN's fused attention excluded (training's captures never use it: target/sdpa.py).

With --draft, the draft's proposed tokens at a few anchors of each sequence, three ways:
teacher-forced as training computes it (packed blocks over the bucketed capture), the serving
round (`draft.draft` over the serving capture's context) and the same round in float32 eager,
against the sequence's own next tokens; then the engine's drafter (its static context cache, the
block's attention through the split-KV kernel and through SDPA), counting non-finite hidden states
and logits. Training and serving must agree nearly always. Slot 0 is compared for every draft; a
draft without a Markov head (DFlash) drafts each slot from the context alone, so there every slot
k is compared too (right against token p+1+k, and taught against served), which is where a served
acceptance of zero past the first slot would show whether serving or training is at fault. Then τ of
the prompt served three ways: the reference loop (speculative/decode.py), and the engine with the
draft's context attention through the split-KV kernel and through SDPA (EngineConfig.draft_attention),
the kernel once more with cuDNN excluded from the target's attention, and once more eagerly (no CUDA
graphs, each round read before the next is queued); each greedy and at T=1.
Glossary: T tokens, m·D captured width, γ block size.
"""

from __future__ import annotations

import argparse
import json
from contextlib import nullcontext
from pathlib import Path

import torch

from splitserve.config import TargetConfig
from splitserve.data import ChatTemplate, encode_prompt, read_prompts, resolve_prompts_path
from splitserve.loading import load_draft
from splitserve.config import EngineConfig
from splitserve.speculative.decode import SpecDecoder, target_decode
from splitserve.speculative.drafter import engine_drafter
from splitserve.speculative.engine import Engine, SamplingParams
from splitserve.target.native.attention_kernel import decode_attention
from splitserve.target import load_target
from splitserve.target.bucketed import BucketedCapture
from splitserve.target.sdpa import varlen_sdpa
from splitserve.train.packing import pack_blocks


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|, in float32 (inf where a holds a non-finite value)."""
    a, b = a.float(), b.float()
    if not torch.isfinite(a).all():
        return float("inf")
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def serving_capture(target, ids: torch.Tensor, prefill: int, piece: int) -> torch.Tensor:
    """ids (1, T) -> aux (1, T, m·D) of forward_static: a prefill of `prefill` tokens, then pieces
    of `piece` tokens (a verify's γ+1), as the engine writes them."""
    t = ids.shape[1]
    cache = target.new_static_cache(t + piece)
    pos = torch.arange(t, device=ids.device)
    out, p = [], 0
    while p < t:
        n = prefill if p == 0 else min(piece, t - p)
        _, cap = target.forward_static(ids[:, p:p + n], cache, pos[p:p + n])
        out.append(cap.aux)
        p += n
    return torch.cat(out, 1)


@torch.no_grad()
def block_tokens(draft, ids: torch.Tensor, aux: torch.Tensor, anchors: list[int]) -> tuple[list[list[int]], list[list[int]]]:
    """-> (teacher-forced tokens as training computes them, served tokens), (n, γ) each, at `anchors`.
    Past slot 0 the two differ by design where a Markov head reads the previous token (the true one
    when taught, the drafted one when served); without one they must agree at every slot."""
    g, t = draft.arch.block_size, ids.shape[1]
    dev = ids.device
    a = torch.tensor([anchors], device=dev)
    n = len(anchors)
    packed = pack_blocks(ids, torch.ones_like(ids, dtype=torch.bool), torch.tensor([t], device=dev), a,
                         torch.ones(1, n, dtype=torch.bool, device=dev), g, draft.arch.mask_token_id,
                         draft.arch.context_window)
    aux = aux.to(next(draft.parameters()).dtype)
    with varlen_sdpa():
        ctx = draft.context_kv(aux, torch.arange(t, device=dev)[None])
        h = draft.backbone(packed.block_ids, packed.block_pos, ctx, packed.mask).view(1, n, g, -1)[0]
    prev = ids[0][packed.label_pos[0] - 1]  # (n, γ)
    logits = draft.head_logits(h, draft.markov_latent(h, prev))  # (n, γ, N)
    taught = draft.to_target(logits.argmax(-1)).tolist()
    served = []
    for p in anchors:
        kv = draft.context_kv(aux[:, :p], torch.arange(p, device=dev)[None])
        served.append(draft.draft(kv, ids[0, p], p)[0].tolist())
    return taught, served


@torch.no_grad()
def engine_block_tokens(draft, ids: torch.Tensor, aux: torch.Tensor, anchors: list[int],
                        attend) -> tuple[list[list[int]], int, int]:
    """The engine's own drafter (static context cache; `attend` the split-KV kernel, None SDPA under
    a mask) at each anchor -> (target ids (n, γ), non-finite entries of the block's hidden states,
    non-finite draft logits). A NaN logit makes torch's argmax pick it and a T>0 draw fail."""
    t = ids.shape[1]
    dev = ids.device
    cap = t + draft.arch.block_size + 1
    drafter = engine_drafter(draft, cap, dev, attend)
    aux = aux.to(next(draft.parameters()).dtype)
    bad = {"h": 0, "logits": 0}

    def count(name):
        def hook(_m, _i, out):
            bad[name] += int((~torch.isfinite(out.float())).sum())
        return hook

    hooks = [draft.norm.register_forward_hook(count("h")), draft.lm_head.register_forward_hook(count("logits"))]
    try:
        tokens = []
        for p in anchors:  # the context 0..p-1 rewritten each time: a block overwrites its own slots
            drafter.commit(aux[:, :p], torch.zeros((), dtype=torch.long, device=dev), ids[0, 1:p + 1], p - 1)
            got = drafter.propose(ids[0, p], torch.tensor(p, device=dev), window=cap)[0]
            tokens.append(got.tolist())
    finally:
        for h in hooks:
            h.remove()
    return tokens, bad["h"], bad["logits"]


def slot0(blocks: list[list[int]]) -> list[int]:
    """(n, γ) drafted blocks -> their first tokens (n,)."""
    return [b[0] for b in blocks]


def tau(accepts: list[int]) -> float:
    """Tokens committed per round: accepted draft tokens + the target's own."""
    return sum(a + 1 for a in accepts) / max(len(accepts), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default=None, help="a run directory: compare its teacher-forced and served tokens")
    ap.add_argument("--prompts", default="chitchat")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=400, help="the target's greedy reply appended to each prompt")
    ap.add_argument("--served-tokens", type=int, default=128, help="tokens each prompt is served for (τ)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default=None)
    ap.add_argument("--capture-max-len", type=int, default=8192,
                    help="training's data.max_length: sets the largest capture bucket, as training does "
                         "(a sequence past it is captured alone at its own length)")
    ap.add_argument("--no-cudnn-attention", action="store_true",
                    help="keep cuDNN's fused attention out of every SDPA call of the process")
    args = ap.parse_args()
    if args.no_cudnn_attention:
        torch.backends.cuda.enable_cudnn_sdp(False)

    dev = torch.device(args.device)
    target = load_target(TargetConfig(path=args.target, dtype=args.dtype), dev)
    draft = load_draft(args.draft, target).eval() if args.draft else None
    draft32 = load_draft(args.draft, target).float().eval() if args.draft else None
    bucketed = BucketedCapture(target, max_len=args.capture_max_len, use_graphs=dev.type == "cuda")
    piece = (draft.arch.block_size + 1) if draft is not None else 17
    rows, served_prompts, agree = [], [], {"taught_right": 0, "served_right": 0, "served32_right": 0, "same": 0, "n": 0}
    slots: dict[str, list[int]] = {}  # per-slot counts over agree["n"] anchors, for a draft without a Markov head
    for prompt in read_prompts(resolve_prompts_path(args.prompts))[: args.num_prompts]:
        ids = encode_prompt(target.tokenizer, prompt, ChatTemplate())
        prompt_ids = list(ids)
        with varlen_sdpa():
            ids = ids + target_decode(target, ids, args.new_tokens)
        x = torch.tensor(ids, device=dev)[None]
        t = x.shape[1]
        with torch.no_grad(), varlen_sdpa():
            eager = target.capture(x).aux
        graph = bucketed(x[0]).aux
        served = serving_capture(target, x, min(t, 128), piece)
        with varlen_sdpa():  # the same forward with cuDNN's attention excluded, as training's captures run
            served_nocudnn = serving_capture(target, x, min(t, 128), piece)
        row = {"tokens": t, "bucket": bucketed.bucket(t) if bucketed.bucket(t) <= bucketed.max_bucket else None,
               "bucketed_vs_eager": rel(graph, eager), "serving_vs_eager": rel(served, eager),
               "serving_without_cudnn_vs_eager": rel(served_nocudnn, eager),
               "aux_nonfinite": {"eager": int((~torch.isfinite(eager)).sum()),
                                 "serving": int((~torch.isfinite(served)).sum())},
               "aux_max_abs": float(eager.abs().max())}
        if draft is not None:
            g = draft.arch.block_size
            anchors = list(range(max(1, t // 4), t - g - 1, max(1, (t - g) // 24)))
            taught, _ = block_tokens(draft, x, graph, anchors)
            _, serv = block_tokens(draft, x, served, anchors)
            _, serv32 = block_tokens(draft32, x, served.float(), anchors)
            truth = [ids[p + 1:p + 1 + g] for p in anchors]  # (n, γ): slot k drafts token p+1+k
            agree["taught_right"] += sum(a == b for a, b in zip(slot0(taught), slot0(truth)))
            agree["served_right"] += sum(a == b for a, b in zip(slot0(serv), slot0(truth)))
            agree["served32_right"] += sum(a == b for a, b in zip(slot0(serv32), slot0(truth)))
            agree["same"] += sum(a == b for a, b in zip(slot0(taught), slot0(serv)))
            agree["n"] += len(anchors)
            engine = {}
            for kind, attend in (("kernel", decode_attention), ("sdpa", None)):
                eng, bad_h, bad_logits = engine_block_tokens(draft, x, served, anchors, attend)
                engine[kind] = eng
                agree[f"engine_{kind}_right"] = agree.get(f"engine_{kind}_right", 0) + sum(
                    a == b for a, b in zip(slot0(eng), slot0(truth)))
                agree[f"engine_{kind}_nonfinite_h"] = agree.get(f"engine_{kind}_nonfinite_h", 0) + bad_h
                agree[f"engine_{kind}_nonfinite_logits"] = agree.get(f"engine_{kind}_nonfinite_logits", 0) + bad_logits
            if draft.markov is None:  # every slot from the context alone: comparable slot by slot
                for name, blocks, ref in (("taught_right", taught, truth), ("served_right", serv, truth),
                                          ("engine_kernel_right", engine["kernel"], truth),
                                          ("engine_sdpa_right", engine["sdpa"], truth),
                                          ("taught_equals_served", taught, serv),
                                          ("taught_equals_engine_kernel", taught, engine["kernel"])):
                    count = slots.setdefault(name, [0] * g)
                    for block, want in zip(blocks, ref):
                        for k in range(g):
                            count[k] += int(block[k] == want[k])
            with varlen_sdpa():
                loop = SpecDecoder(target, draft).generate(prompt_ids, args.served_tokens)
            row["tau_loop"] = tau(loop.accepts)
            for kind, backends, eager in (("kernel", nullcontext, False), ("sdpa", nullcontext, False),
                                          ("kernel_without_cudnn", varlen_sdpa, False), ("kernel_eager", nullcontext, True)):
                with backends():  # CUDA graphs keep the attention backend chosen at capture
                    # kernel_eager: no CUDA graphs and no queued next round (each round read before the next)
                    graphs = {"use_cuda_graphs": False, "overlap_steps": False} if eager else {}
                    engine = Engine(target, draft, EngineConfig(max_context=len(prompt_ids) + args.served_tokens + 8,
                                                                draft_attention=kind.split("_")[0], **graphs))
                    stats = engine.generate(prompt_ids, SamplingParams(max_tokens=args.served_tokens))
                row[f"tau_engine_{kind}"] = tau(stats.accepts)
                row[f"engine_{kind}_equals_loop"] = stats.tokens == loop.tokens
                del engine
        rows.append(row)
        print(json.dumps(row), flush=True)
        served_prompts.append(prompt_ids)
    # T=1 last: a device-side assert there (a non-finite draw) ends the process, after the rest is printed
    for i, prompt_ids in enumerate(served_prompts if draft is not None else []):
        engine = Engine(target, draft, EngineConfig(max_context=len(prompt_ids) + args.served_tokens + 8))
        stats = engine.generate(prompt_ids, SamplingParams(max_tokens=args.served_tokens, temperature=1.0, seed=0))
        rows[i]["tau_engine_kernel_T1"] = tau(stats.accepts)
        print(json.dumps({"prompt": i, "tau_engine_kernel_T1": rows[i]["tau_engine_kernel_T1"]}), flush=True)
        del engine
    result = {"target": args.target, "device": str(dev), "dtype": args.dtype, "prompts": rows}
    if draft is not None:
        result["first_token"] = agree
        if slots:
            result["every_slot"] = slots
            print("every slot (a draft without a Markov head), counts over", agree["n"], "anchors:")
            for name, count in slots.items():
                print(f"  {name:28s}", " ".join(f"{c:3d}" for c in count))
        print(f"first draft token at {agree['n']} anchors: teacher-forced right {agree['taught_right']}, served right "
              f"{agree['served_right']} (float32 {agree['served32_right']}), teacher-forced == served {agree['same']}")
        for kind in ("kernel", "sdpa"):
            print(f"engine drafter, {kind} attention: right {agree[f'engine_{kind}_right']}, non-finite hidden "
                  f"entries {agree[f'engine_{kind}_nonfinite_h']}, non-finite logits {agree[f'engine_{kind}_nonfinite_logits']}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
