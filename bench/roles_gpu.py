"""Per-role cost of split training on one GPU, SmolLM2-135M shape with random weights.

    python bench/roles_gpu.py [--shape smollm2|llama-8b|qwen3.5-9b] [--tokens 2048 8192 32768] [--anchors 512]
        [--gamma 8 16] [--loss-chunk-rows N] [--out DIR]

Target role: one capture (m captured layers + final hidden state) of a T-token sequence.
Draft role: one training step (forward + backward + AdamW) on that record with N anchors.
Per row length: time, tokens/s and peak device memory of each role (issue 43's 2K/8K/32K table:
`--shape llama-8b --tokens 2048 8192 32768`); a length that runs out of memory is recorded as such.
Also the device's raw copy bandwidth, for scale. Step time does not depend on weight values,
so random weights of the real shapes give real timings (no checkpoint has to travel).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from splitserve.config import DraftConfig, LossConfig, TargetConfig
from splitserve.models.build import build_draft, resolve_arch
from splitserve.records import HiddenRecord
from splitserve.target.hf import wrap_hf_model
from splitserve.train.step import collate, draft_loss


def smollm2_shape():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                       num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=16384,
                       rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True)


def llama8b_shape():
    """An 8B-class Llama/Qwen3-like shape (36 layers, D 4096, GQA 32/8, FFN 12,288, V 151,936)."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                       head_dim=128, intermediate_size=12288, vocab_size=151936, max_position_embeddings=32768,
                       rope_theta=1e6, tie_word_embeddings=False)


def qwen35_9b_shape():
    """Qwen3.5-9B's shape (transformers' Qwen3_5TextConfig defaults: 32 layers, three gated-DeltaNet
    layers to one gated full-attention layer, D 4096, attention 16/4 heads of 256, linear attention
    16 key / 32 value heads of 128, conv 4, FFN 12,288, V 248,320): a dense hybrid that fits one GPU."""
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(max_position_embeddings=32768)


RANDOM_SHAPES = {"llama-8b": llama8b_shape, "smollm2": smollm2_shape, "qwen3.5-9b": qwen35_9b_shape}


def random_target(shape: str, device: str = "cuda"):
    """A bf16 target of a RANDOM_SHAPES shape with random weights (step time does not depend on them)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(RANDOM_SHAPES[shape](), dtype=torch.bfloat16)
    return wrap_hf_model(model.eval(), TargetConfig(name=f"{shape}-shape", dtype="bfloat16", device=device))


def untrained_draft(target, layers: int, gamma: int, draft_vocab: int = 0):
    """A bf16 DSpark draft for `target` with the default head settings, freshly initialised;
    draft_vocab > 0: a head over that many tokens (its map the first ids: a round's time does not
    depend on which)."""
    torch.manual_seed(0)
    cfg = DraftConfig(block_size=gamma, num_layers=layers, draft_vocab_size=draft_vocab)
    arch = resolve_arch(cfg, target.info, target.config, target.tokenizer)
    return build_draft(arch, target).to(torch.bfloat16).eval()


def timed(fn, reps: int) -> float:
    """Median seconds of fn() over reps, with CUDA events."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def copy_bandwidth() -> float:
    x = torch.randn(1 << 28, device="cuda")  # 1 GiB
    y = torch.empty_like(x)
    t = timed(lambda: y.copy_(x), 10)
    return 2 * x.numel() * 4 / t / 1e9  # GB/s, bytes read + written


def measure(target, tokens: int, gammas: list[int], anchors: int, chunk_rows: int, layers: int = 5) -> dict:
    """One T-token row: the target role's capture and each γ's draft training step -> time,
    tokens/s and peak device memory above what was resident before each."""
    dev = torch.device("cuda")
    ids = torch.randint(0, target.info.vocab_size, (1, tokens), device=dev)
    out = {}
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    target.capture(ids)
    t_cap = timed(lambda: target.capture(ids), 5)
    cap = target.capture(ids)
    out["target"] = {"capture_s": t_cap, "tokens_per_s": tokens / t_cap,
                     "peak_GiB_above_weights": (torch.cuda.max_memory_allocated() - base) / 2**30,
                     "record_MB_bf16": (cap.aux.numel() + cap.final.numel()) * 2 / 1e6}
    loss_mask = torch.ones(tokens, dtype=torch.bool)
    rec = HiddenRecord(0, ids[0].cpu(), loss_mask, cap.aux[0].float().cpu(), cap.final[0].float().cpu())
    del cap
    for gamma in gammas:
        arch = resolve_arch(DraftConfig(num_layers=layers, block_size=gamma, mask_token_id=16), target.info,
                            target.config)
        draft = build_draft(arch, target).to(torch.bfloat16)
        params = [p for p in draft.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-4)
        batch = collate([rec], dev, torch.bfloat16)
        gen = torch.Generator().manual_seed(0)

        def step(draft=draft, batch=batch, opt=opt):  # bound now: the names are deleted after this γ
            loss, _ = draft_loss(draft, batch, anchors, LossConfig(), gen, chunk_rows=chunk_rows)
            opt.zero_grad(set_to_none=True)
            loss.total.backward()
            opt.step()

        step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        t_step = timed(step, 5)
        out[f"draft_gamma{gamma}"] = {
            "layers": layers, "anchors": anchors, "block_positions": anchors * gamma, "step_s": t_step,
            "record_tokens_per_s": tokens / t_step, "loss_chunk_rows": chunk_rows,
            "peak_GiB_above_model": (torch.cuda.max_memory_allocated() - before) / 2**30,
        }
        del draft, opt, batch
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(RANDOM_SHAPES), default="smollm2")
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192], help="row lengths, e.g. 2048 8192 32768")
    ap.add_argument("--anchors", type=int, default=512)
    ap.add_argument("--gamma", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--loss-chunk-rows", type=int, default=0, help="train.loss_chunk_rows (0: all rows at once)")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    target = random_target(args.shape)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": args.shape,
              "copy_GBps": round(copy_bandwidth(), 1), "by_tokens": {}}
    for tokens in args.tokens:
        try:
            result["by_tokens"][str(tokens)] = measure(target, tokens, args.gamma, args.anchors, args.loss_chunk_rows)
        except torch.OutOfMemoryError as e:  # the table says where memory ran out
            result["by_tokens"][str(tokens)] = {"out_of_memory": str(e)[:300]}
            torch.cuda.empty_cache()
        print(json.dumps({tokens: result["by_tokens"][str(tokens)]}, indent=1), flush=True)
    if len(args.tokens) == 1:  # the layout the earlier single-length results use
        result.update(tokens=args.tokens[0], **result["by_tokens"][str(args.tokens[0])])
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "roles_gpu.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
