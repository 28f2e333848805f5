"""The draft's exact greedy Markov stage: the per-position loop against the fused kernel.

    python bench/markov_step_gpu.py --out markov_step.json [--shapes llama-8b smollm2] [--iters 200]

For each vocabulary of RANDOM_SHAPES (151,936 and 49,152 tokens; rank r = 256, γ = 16, bf16)
the stage runs on the same random inputs two ways, each captured as one CUDA graph and replayed
back to back:
  loop    what DSparkDraft.draft runs with markov_kernel=False: per position a W1 gather, the
          (V x r) product, the add and the argmax (models/dspark.py); eager, and compiled by
          inductor as the engine's --compile draft is
  kernel  models/markov_step_kernel.py: one launch per position (PDL on, and off; and through
          torch.compile, which must trace through the custom op)
It prints ms per stage, kernels per stage (torch.profiler over one replay) and whether both give
the same tokens (W2 random, so the bias moves the argmax; a near-tie of one bf16 ulp may differ).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from roles_gpu import RANDOM_SHAPES
from round_profile import time_graph

from splitserve.models.markov_step_kernel import markov_greedy_chain, markov_greedy_chain_reference


def stage_inputs(vocab: int, rank: int, gamma: int, device: str) -> dict:
    g = torch.Generator(device="cpu").manual_seed(0)
    bf16 = dict(dtype=torch.bfloat16)
    return {
        "base": torch.randn(gamma, vocab, generator=g).mul(2.0).to(device, **bf16),  # (γ, V) backbone logits
        "w1": torch.randn(vocab, rank, generator=g).mul(0.25).to(device, **bf16),  # (V, r)
        "w2": torch.randn(vocab, rank, generator=g).mul(0.25).to(device, **bf16),  # (V, r)
        "anchor_id": torch.tensor(11, device=device),
    }


def replay_ms(fn, iters: int) -> tuple[float, int]:
    """ms per replay of fn's CUDA graph (back to back), and the kernels one call launches (the
    graph replays the same launches)."""
    ms = time_graph(fn, iters, torch.device("cuda"))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return ms, kernels


def measure(shape: str, iters: int) -> dict:
    cfg = RANDOM_SHAPES[shape]()
    x = stage_inputs(cfg.vocab_size, 256, 16, "cuda")
    out = torch.zeros(16, dtype=torch.long, device="cuda")
    row = {"shape": shape, "vocab": cfg.vocab_size, "rank": 256, "gamma": 16}

    def loop():
        out.copy_(markov_greedy_chain_reference(**x))

    def kernel():
        out.copy_(markov_greedy_chain(**x))  # CUDA tensors: the Triton op

    # the engine's --compile draft: inductor's kernels (and, for the kernel, tracing through its op)
    loop_compiled, kernel_compiled = (torch.compile(f, dynamic=False) for f in (loop, kernel))
    variants = (("loop", loop, None), ("loop_compiled", loop_compiled, None), ("kernel", kernel, "1"),
                ("kernel_nopdl", kernel, "0"), ("kernel_compiled", kernel_compiled, "1"))
    for name, fn, pdl in variants:
        if pdl is not None:
            os.environ["SPLITSERVE_PDL"] = pdl
        fn()
        torch.cuda.synchronize()
        row[f"{name}_tokens"] = out.tolist()
        row[f"{name}_ms"], row[f"{name}_kernels"] = replay_ms(fn, iters)
    os.environ.pop("SPLITSERVE_PDL", None)
    row["same_tokens"] = all(row[f"{n}_tokens"] == row["loop_tokens"] for n, _, _ in variants)
    row["moved_by_bias"] = sum(int(a != b) for a, b in zip(row["loop_tokens"], x["base"].argmax(-1).tolist()))
    w2_mb = cfg.vocab_size * 256 * 2 / 1e6
    row["w2_mb_per_position"] = w2_mb
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["llama-8b", "smollm2"], choices=sorted(RANDOM_SHAPES))
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = [measure(s, args.iters) for s in args.shapes]
    print("| shape | V | loop | loop, compiled | kernel (PDL) | kernel (no PDL) | kernel, compiled "
          "| kernels: loop / compiled / kernel | same tokens | positions the bias moved |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['vocab']:,} | {r['loop_ms']:.3f} ms | {r['loop_compiled_ms']:.3f} ms | "
              f"{r['kernel_ms']:.3f} ms | {r['kernel_nopdl_ms']:.3f} ms | {r['kernel_compiled_ms']:.3f} ms | "
              f"{r['loop_kernels']} / {r['loop_compiled_kernels']} / {r['kernel_kernels']} | {r['same_tokens']} | "
              f"{r['moved_by_bias']} of 16 |")
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "iters": args.iters}
    Path(args.out).write_text(json.dumps({**meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
