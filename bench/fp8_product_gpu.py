"""Are FP8 draft products slow? The weight-only FP8 product at T = 16 rows (a γ = 16 draft block)
on the blocks it had before 2026-12-05 (the first T = 17 sweep's un-swapped dot; with `--copies`
and this tree, "fp8 default" is whatever `linear_kernel.pick_config` gives now) against the
swapped dot the bf16 product uses, at an 8B-class draft's shapes.

    PYTHONPATH=. python bench/fp8_product_gpu.py --out fp8_product.json [--copies 8]

Per product (the draft layer's q|k|v, o, gate|up, down, and the lm_head over 151,936 and 32,000
ids; bench/roles_gpu.py's 8B shape), each with what the fused decoder folds into it, the median
µs per call from a CUDA graph of `--copies` calls on distinct weight copies
(bench/linear_gpu.graph_ms_per_call), PDL on:
  bf16           the bf16 product on its default (swapped) blocks
  fp8 default    the FP8 product on its default blocks
  fp8 swap k=K   the FP8 product on the swapped dot, K columns a step, 3 pipeline stages
Every FP8 variant is checked against the PyTorch reference product on the FP8 weights.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import linear_gpu as lg
import torch

from splitserve.target.native import linear as ref
from splitserve.target.native import linear_kernel as lk

DRAFT = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
         "lm_head": (151936, 4096), "lm_head_32k": (32000, 4096)}
FOLD = {"qkv": dict(norm=True), "o": dict(add=True), "gate_up": dict(norm=True, silu=True), "down": dict(add=True),
        "lm_head": {}, "lm_head_32k": {}}


def fp8_error(case: lg.Case, cfg: lk.Config | None) -> float:
    w8, scale = case.w8
    kw = case.kw()
    got = lk.launch(case.x, w8, scale, None, kw["norm_weight"], kw["residual"], kw["eps"], kw["silu"],
                    cfg=cfg, pdl=True).double()
    want = ref.product(case.x, w8, scale, **kw).double()
    return float((got - want).abs().max() / want.abs().max())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", nargs="+", type=int, default=[16])
    p.add_argument("--copies", type=int, default=8)
    p.add_argument("--replays", type=int, default=15)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    lg.SHAPES["draft8b"] = DRAFT
    lg.FOLDED.update(FOLD)
    lg.LAYERS["draft8b"] = args.copies
    rows = []
    print("| product | T | bf16 µs | fp8 default µs | " + " | ".join(
        f"fp8 swap k{k} µs" for k in (64, 128, 256)) + " |", flush=True)
    for t in args.tokens:
        for layer in DRAFT:
            case = lg.Case("draft8b", layer, t)
            silu = bool(case.fold.get("silu"))
            n_out = case.n // 2 if silu else case.n
            row = dict(layer=layer, T=t, N=case.n, K=case.k, bf16=case.time("fused+pdl", replays=args.replays),
                       fp8_default=case.time("fp8+pdl", replays=args.replays), err_default=fp8_error(case, None))
            cells = []
            mode = lg.MODES["swap"][0]  # the swapped dot, 3 pipeline stages
            for bk in (64, 128, 256):
                cfg = lg.make_config(t, n_out, case.k, 64, bk, 4, mode)
                key = f"fp8_swap_k{bk}_s{mode[1]}"
                try:
                    row[key] = case.time("fp8+pdl", cfg, args.replays)
                    row[key + "_err"] = fp8_error(case, cfg)
                    cells.append(f"{row[key]:.1f} ({row[key + '_err']:.0e})")
                except Exception as e:  # keep the other numbers
                    row[key] = None
                    row[key + "_error"] = f"{type(e).__name__}: {e}"[:200]
                    cells.append("fail")
            rows.append(row)
            print(f"| {layer} | {t} | {row['bf16']:.1f} | {row['fp8_default']:.1f} ({row['err_default']:.0e}) | "
                  + " | ".join(cells) + " |", flush=True)
            del case
            torch.cuda.empty_cache()
    args.out.write_text(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                                        copies=args.copies, rows=rows), indent=1))


if __name__ == "__main__":
    main()
