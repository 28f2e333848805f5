"""The layer products on a GPU: cuBLAS against the Triton weight product, plain and with its
neighbours folded in, with and without PDL, and a sweep of block sizes.

    PYTHONPATH=. python bench/linear_gpu.py --out linear.json
    PYTHONPATH=. python bench/linear_gpu.py --models smollm2 --tokens 1 --no-sweep --out smol.json   (quicker)
    PYTHONPATH=. python bench/linear_gpu.py --models 8b --tokens 17 --sweep-swap --out t17.json    (the swapped dot)

For each product of an 8B-class target (hidden 4096, 32/8 heads of 128, FFN 12288, vocab 151936)
and of SmolLM2-135M (hidden 576, 9/3 heads of 64, FFN 1536, vocab 49152), at T = 1 (decode) and
T = 17 (verify of γ = 16), bf16, the median time per call of:
  cublas       F.linear alone (what the cublas decoder runs; its norm, SiLU and add are extra kernels)
  triton       the Triton product alone (linear_kernel.pick_config), PDL off
  fused        the Triton product with what the fused decoder folds into it (the norm before q|k|v
               and gate|up, SiLU·up after gate|up, the residual add after o and down), PDL off
  fused+pdl    the same launched with programmatic dependent launch
  fp8+pdl      the fused product on FP8 weights (not lossless)
  best         the fastest block sizes of the sweep, fused+pdl
Calls are replayed from a CUDA graph of one call per layer, each on its own copy of the weight
(as a decode step reads each layer's weight once; past L2 for the 8B-class shapes), so PDL
overlaps a call with the one before it as in the decoder. Every Triton variant is checked
against the reference (target/native/linear.py) on the same inputs. Needs torch and triton only.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from splitserve.target.native import linear as ref
from splitserve.target.native import linear_kernel as lk

# (N, K) of each product: weight rows, in features; and what the fused decoder folds into it.
SHAPES = {
    "8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)},
    "smollm2": {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)},
}
LAYERS = {"8b": 36, "smollm2": 30}
NO_FOLD: set[str] = set()  # --no-fold: pieces left to separate kernels (norm, add, silu)
FOLDED = {"qkv": dict(norm=True), "o": dict(add=True), "gate_up": dict(norm=True, silu=True), "down": dict(add=True)}
# Candidate (block_n, block_k, num_warps) per path, each in every mode; the default pick is timed too.
SWEEP = {
    "gemv": [(8, 1024, 4), (4, 2048, 4), (8, 2048, 8), (16, 1024, 8), (8, 1024, 8), (16, 512, 4)],
    "gemv_silu": [(4, 1024, 4), (2, 2048, 4), (4, 2048, 8), (8, 1024, 8), (4, 1024, 8)],
    "dot": [(64, 64, 8), (32, 64, 4), (64, 128, 8), (32, 128, 4), (128, 64, 8)],
    "dot_silu": [(64, 64, 8), (32, 64, 4), (32, 128, 4), (64, 128, 8)],
    "gemv_fp8": [(8, 2048, 4), (16, 512, 4), (8, 512, 4), (32, 256, 4), (16, 1024, 8)],
    "gemv_silu_fp8": [(4, 2048, 4), (8, 512, 4), (16, 256, 4), (4, 512, 4), (8, 1024, 8)],
}
# (prefetch, num_stages, reduce_each, block_ptr[, swap_ab]): the next tile held in registers, or the
# compiler's pipelining (plain or block pointers); at T = 1 the K sum once after the loop or every
# step; at T >= 2 the weight tile as the dot's right or (swap_ab) left operand. The swapped modes
# split K as pick_config does; the others keep one program per N tile. Products are timed through
# the kernel itself, so a folded norm is each program's own pass (--no-fold norm: without it).
MODES = {"gemv": [(True, 1, False, False), (True, 1, True, False)],
         "dot": [(True, 1, False, False), (False, 3, False, False), (False, 3, False, True), (False, 4, False, True)],
         "swap": [(False, 3, False, False, True), (False, 4, False, False, True)]}
SWEEP["swap"] = [(64, 64, 4), (64, 128, 4), (128, 64, 4), (64, 256, 4)]
SWEEP["swap_silu"] = [(64, 64, 4), (64, 128, 4), (128, 64, 8)]


def make_config(t: int, n: int, k: int, block_n: int, block_k: int, warps: int, mode: tuple) -> lk.Config:
    use_dot = t > 1
    block_k = min(block_k, lk._pow2(k))
    prefetch, stages, reduce_each, block_ptr, swap_ab = (*mode, False)[:5]
    split, k_per_split = lk.split_k(n, k, block_n, block_k) if swap_ab else (1, -(-k // block_k) * block_k)
    return lk.Config(max(16, lk._pow2(t)) if use_dot else 1, block_n, block_k, split, k_per_split,
                     use_dot, warps, prefetch, stages, reduce_each, block_ptr, swap_ab)


def graph_ms_per_call(calls: list, replays: int) -> float:
    """Median ms per call of a CUDA graph holding `calls` back to back."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and allocate before capture
        for c in calls[:2]:
            c()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(calls))
    del graph
    return statistics.median(times)


class Case:
    """One product of one model at one T: a weight per layer, its inputs and its reference."""

    def __init__(self, model: str, layer: str, t: int):
        n, k = SHAPES[model][layer]
        self.model, self.layer, self.t, self.n, self.k = model, layer, t, n, k
        self.fold = {k: v for k, v in FOLDED[layer].items() if k not in NO_FOLD}
        g = torch.Generator(device="cuda").manual_seed(0)
        bf = dict(device="cuda", dtype=torch.bfloat16)
        self.x = torch.randn(t, k, generator=g, device="cuda").to(torch.bfloat16) * 2  # (T, K)
        base = (torch.randn(n, k, generator=g, device="cuda") * k**-0.5).to(torch.bfloat16)  # (N, K)
        self.ws = [base.clone() for _ in range(LAYERS[model])]  # distinct memory, one per layer
        self.w8 = ref.quantize_fp8(base)
        norm = (0.5 + torch.rand(k, generator=g, device="cuda")).to(torch.bfloat16)  # (K,)
        self.norm = norm if self.fold.get("norm") else None
        n_out = n // 2 if self.fold.get("silu") else n
        self.res = torch.randn(t, n_out, generator=g, **bf) if self.fold.get("add") else None

    def kw(self) -> dict:
        return dict(norm_weight=self.norm, eps=1e-5, residual=self.res, silu=bool(self.fold.get("silu")))

    def fused(self, w, scale=None, cfg=None, pdl=False):
        kw = self.kw()
        return lambda: lk.launch(self.x, w, scale, None, kw["norm_weight"], kw["residual"], kw["eps"], kw["silu"],
                                 cfg=cfg, pdl=pdl)

    def time(self, variant: str, cfg: lk.Config | None = None, replays: int = 15) -> float:
        if variant == "cublas":
            calls = [lambda w=w: F.linear(self.x, w) for w in self.ws]
        elif variant == "triton":
            calls = [lambda w=w: lk.launch(self.x, w, None, None, None, None, 0.0, False, cfg=cfg, pdl=False)
                     for w in self.ws]
        elif variant == "fp8+pdl":
            w8, scale = self.w8
            copies = [w8.clone() for _ in self.ws]
            calls = [self.fused(w, scale, cfg, pdl=True) for w in copies]
        else:
            calls = [self.fused(w, None, cfg, pdl=variant != "fused") for w in self.ws]
        return 1e3 * graph_ms_per_call(calls, replays)

    def error(self, cfg: lk.Config | None = None) -> float:
        """Relative max error of the fused kernel against the reference composition (float64 view)."""
        got = self.fused(self.ws[0], None, cfg, pdl=True)().double()
        want = ref.product(self.x, self.ws[0], **self.kw()).double()
        return float((got - want).abs().max() / want.abs().max())

    def weight_bytes(self) -> int:
        return self.n * self.k * 2


def sweep_key(t: int, silu: bool, swap: bool = False) -> str:
    return ("gemv" if t == 1 else "swap" if swap else "dot") + ("_silu" if silu else "")


def run_case(case: Case, sweep: bool, replays: int, fp8: bool = False, swap: bool = False) -> dict:
    silu = bool(case.fold.get("silu"))
    n_out = case.n // 2 if silu else case.n
    default = lk.pick_config(case.t, n_out, case.k, 1 if fp8 else 2, silu)
    swept = "fp8+pdl" if fp8 else "fused+pdl"
    row = dict(model=case.model, layer=case.layer, T=case.t, N=case.n, K=case.k, default=default._asdict(),
               weight_mb=case.weight_bytes() / 1e6, err_default=case.error())
    for v in ("cublas", "triton", "fused", "fused+pdl", "fp8+pdl"):
        try:
            row[v] = case.time(v, replays=replays)
        except Exception as e:  # keep the other numbers
            row[v] = None
            row[f"{v}_error"] = f"{type(e).__name__}: {e}"[:300]
    if sweep:
        best = (row[swept] or float("inf"), default, "default")
        tried = []
        key = sweep_key(case.t, silu, swap)
        for (bn, bk, warps), mode in itertools.product(SWEEP[key + ("_fp8" if fp8 else "")], MODES[key.split("_")[0]]):
            cfg = make_config(case.t, n_out, case.k, bn, bk, warps, mode)
            try:
                us = case.time(swept, cfg, replays)
                err = case.error(cfg)
            except Exception as e:
                tried.append(dict(cfg=cfg._asdict(), error=f"{type(e).__name__}: {e}"[:200]))
                continue
            tried.append(dict(cfg=cfg._asdict(), us=us, err=err))
            if us < best[0] and err < 2e-2:
                best = (us, cfg, "sweep")
        row["sweep"] = tried
        row["best"], row["best_cfg"] = best[0], best[1]._asdict()
    return row


def table(rows: list[dict], tbps: float) -> str:
    cols = ["cublas", "triton", "fused", "fused+pdl", "fp8+pdl", "best"]
    lines = ["| model | product | T | MB | " + " | ".join(f"{c} µs" for c in cols)
             + " | best cfg (n, k, warps, split, mode) "
             "| fused+pdl % of copy BW | err |", "|" + "---|" * (len(cols) + 7)]
    for r in rows:
        cells = [f"{r[c]:.1f}" if r.get(c) else "-" for c in cols]
        b = r.get("best_cfg") or r["default"]
        mode = (("pre" if b["prefetch"] else f"st{b['num_stages']}") + ("/red" if b["reduce_each"] else "")
                + ("/bp" if b.get("block_ptr") else "") + ("/swap" if b.get("swap_ab") else ""))
        frac = r["weight_mb"] * 1e6 / (r["fused+pdl"] * 1e-6) / (tbps * 1e12) if r.get("fused+pdl") else float("nan")
        lines.append(f"| {r['model']} | {r['layer']} | {r['T']} | {r['weight_mb']:.1f} | " + " | ".join(cells)
                     + f" | {b['block_n']}, {b['block_k']}, {b['num_warps']}, {b['split_k']}, {mode} "
                     f"| {100 * frac:.0f}% "
                     f"| {r['err_default']:.1e} |")
    for model in dict.fromkeys(r["model"] for r in rows):
        for t in dict.fromkeys(r["T"] for r in rows if r["model"] == model):
            group = [r for r in rows if r["model"] == model and r["T"] == t]
            sums = [sum(r[c] or 0 for r in group) if all(r.get(c) for r in group) else None for c in cols]
            lines.append(f"| {model} | layer (4 products) | {t} | {sum(r['weight_mb'] for r in group):.0f} | "
                         + " | ".join(f"{s:.1f}" if s else "-" for s in sums) + " | | | |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--tokens", nargs="+", type=int, default=[1, 17])
    p.add_argument("--replays", type=int, default=15)
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--sweep-fp8", action="store_true", help="sweep the blocks of the fp8 product (T = 1) instead")
    p.add_argument("--sweep-models", nargs="*", default=["8b"], help="models whose products get the block sweep")
    p.add_argument("--no-fold", nargs="*", default=[], choices=["norm", "add", "silu"],
                   help="leave these out of the fused product (time the product without them)")
    p.add_argument("--sweep-swap", action="store_true",
                   help="at T >= 2 sweep the swapped-operand dot (weight tile on the left, K split) instead")
    p.add_argument("--copy-tbps", type=float, default=4.26, help="device-to-device copy bandwidth, for the %% column")
    p.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = p.parse_args()
    NO_FOLD.update(args.no_fold)
    if not torch.cuda.is_available():
        raise SystemExit("linear_gpu.py: needs a CUDA GPU (the kernel's CPU check is tests/test_kernel_linear.py)")
    rows = []
    for model in args.models:
        for t in args.tokens:
            for layer in SHAPES[model]:
                case = Case(model, layer, t)
                row = run_case(case, not args.no_sweep and model in args.sweep_models, args.replays, args.sweep_fp8,
                               args.sweep_swap)
                rows.append(row)
                print(f"{model} {layer} T={t}: " + ", ".join(
                    f"{v} {row[v]:.1f}" for v in ("cublas", "triton", "fused", "fused+pdl", "fp8+pdl", "best")
                    if row.get(v)) + f" µs; err {row['err_default']:.1e}", flush=True)
                del case
                torch.cuda.empty_cache()
                if args.out:
                    args.out.write_text(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                                                        rows=rows), indent=1))
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}: "
          "median µs per call, one weight copy per layer")
    print(table(rows, args.copy_tbps))


if __name__ == "__main__":
    main()
