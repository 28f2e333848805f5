"""The weight-only linear on a GPU: cuBLAS bf16 vs the Triton kernel on bf16 and on fp8 weights.

    PYTHONPATH=. python bench/linear_gpu.py --out linear.json
    PYTHONPATH=. python bench/linear_gpu.py --models smollm2 --tokens 1 --out smol.json   (quicker)

For each linear of an 8B-class target (hidden 4096, 32/8 heads of 128, FFN 12288, vocab 151936)
and of SmolLM2-135M (hidden 576, 9/3 heads of 64, FFN 1536, vocab 49152), at T = 1 (decode) and
T = 17 (verify of γ = 16): the median time per call and the weight bandwidth it reaches (weight
bytes / time, and its fraction of the peak). Calls are replayed from a CUDA graph that rotates
over enough copies of the weight that each replay reads more than 4x the L2 cache, so every call
reads its weight from HBM, as one decode step reads each weight once. Also the max abs error of
each Triton variant against its reference (target/native/linear.py), and a check that
torch.compile(fullgraph=True) traces through the custom op. Needs torch and triton only.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from splitserve.target.native import linear as ref
from splitserve.target.native import linear_kernel as lk

# (N, K) of each linear: out features, in features.
SHAPES = {
    "8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
           "lm_head": (151936, 4096)},
    "smollm2": {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536),
                "lm_head": (49152, 576)},
}
LAYER = ("qkv", "o", "gate_up", "down")  # one decoder layer's linears, summed in the table
VARIANTS = ("cublas_bf16", "triton_bf16", "triton_fp8")
L2_BYTES = 60e6
MIN_CALLS = 20


def _call(variant: str):
    if variant == "cublas_bf16":
        return lambda x, w, s: F.linear(x, w)
    return lambda x, w, s: lk.linear_triton(x, w, s)


def time_variant(variant: str, x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None,
                 replays: int) -> tuple[float, int]:
    """Median µs per call over graph replays, and the weight bytes one call reads."""
    n, k = w.shape
    w_bytes = n * k * w.element_size() + (scale.numel() * 4 if scale is not None else 0)
    copies = max(2, int(-(-4 * L2_BYTES // w_bytes)))
    ws = [w.clone() for _ in range(copies)]  # (N, K) each: distinct memory, so no call hits L2
    calls = max(MIN_CALLS, copies)
    fn = _call(variant)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and allocate (Triton JIT, cuBLAS workspace) before capture
        for i in range(3):
            fn(x, ws[i % copies], scale)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(x, ws[i % copies], scale)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    del graph, ws
    torch.cuda.empty_cache()
    return statistics.median(times), w_bytes


def bench_shape(model: str, layer: str, n: int, k: int, t: int, replays: int, peak_tbps: float) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16, generator=g)  # (T, K)
    w = (torch.randn(n, k, device="cuda", generator=g) * k**-0.5).bfloat16()  # (N, K)
    w8, scale = ref.quantize_fp8(w)
    args = {"cublas_bf16": (w, None), "triton_bf16": (w, None), "triton_fp8": (w8, scale)}
    rows = []
    for variant in VARIANTS:
        wv, sv = args[variant]
        us, w_bytes = time_variant(variant, x, wv, sv, replays)
        err = None
        if variant != "cublas_bf16":
            want = ref.linear(x, wv, sv).float()
            err = float((lk.linear_triton(x, wv, sv).float() - want).abs().max())
        gbps = w_bytes / (us * 1e-6) / 1e9
        cfg = lk.pick_config(t, n, k, wv.element_size())._asdict() if variant != "cublas_bf16" else None
        rows.append(dict(model=model, layer=layer, N=n, K=k, T=t, variant=variant, us=us, weight_bytes=w_bytes,
                         gbps=gbps, frac_peak=gbps / (peak_tbps * 1e3), max_abs_err=err, config=cfg))
    return rows


def _cell(r: dict) -> str:
    return f"{r['us']:.1f} ({r['gbps']:.0f} GB/s, {100 * r['frac_peak']:.0f}%)"


def table(rows: list[dict], peak_tbps: float) -> str:
    head = ["model", "layer", "N x K", "T", *(f"{v} µs (GB/s, % peak)" for v in VARIANTS), "err bf16", "err fp8"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = sorted({(r["model"], r["T"]) for r in rows}, key=lambda m: (list(SHAPES).index(m[0]), m[1]))
    for model, t in keys:
        group = [r for r in rows if r["model"] == model and r["T"] == t]
        for layer in [*SHAPES[model], "layer (qkv+o+gate_up+down)"]:
            if layer in SHAPES[model]:
                by = {r["variant"]: r for r in group if r["layer"] == layer}
                n, k = SHAPES[model][layer]
                errs = [f"{by['triton_bf16']['max_abs_err']:.2e}", f"{by['triton_fp8']['max_abs_err']:.2e}"]
                lines.append(f"| {model} | {layer} | {n} x {k} | {t} | "
                             + " | ".join(_cell(by[v]) for v in VARIANTS) + " | " + " | ".join(errs) + " |")
                continue
            cells = []
            for v in VARIANTS:
                part = [r for r in group if r["variant"] == v and r["layer"] in LAYER]
                us, b = sum(r["us"] for r in part), sum(r["weight_bytes"] for r in part)
                gbps = b / (us * 1e-6) / 1e9
                cells.append(f"{us:.1f} ({gbps:.0f} GB/s, {100 * gbps / (peak_tbps * 1e3):.0f}%)")
            lines.append(f"| {model} | {layer} | | {t} | " + " | ".join(cells) + " | | |")
    return "\n".join(lines)


def compile_check() -> dict:
    """torch.compile(fullgraph=True) traces through splitserve::weight_linear and matches eager."""
    x = torch.randn(17, 576, device="cuda", dtype=torch.bfloat16)  # (T, K)
    w8, scale = ref.quantize_fp8(torch.randn(960, 576, device="cuda") * 576**-0.5)
    bias = torch.randn(960, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(lambda x: lk.linear(x, w8, scale, bias), fullgraph=True)
    try:
        err = max(float((compiled(x[:t]).float() - lk.linear(x[:t], w8, scale, bias).float()).abs().max())
                  for t in (1, 17))
    except Exception as e:  # report it with the timings rather than lose them
        return dict(ok=False, error=f"{type(e).__name__}: {e}"[:500])
    return dict(ok=err < 1e-2, max_abs_err=err)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--tokens", nargs="+", type=int, default=[1, 17])
    p.add_argument("--replays", type=int, default=15)
    p.add_argument("--peak-tbps", type=float, default=4.3, help="HBM bandwidth the fractions are of")
    p.add_argument("--out", type=Path, help="write the rows as JSON here")
    p.add_argument("--no-compile-check", action="store_true", help="skip the torch.compile(fullgraph) check")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("linear_gpu.py: needs a CUDA GPU (the kernel's CPU check is tests/test_kernel_linear.py)")
    rows = []
    for model in args.models:
        for t in args.tokens:
            for layer, (n, k) in SHAPES[model].items():
                rows += bench_shape(model, layer, n, k, t, args.replays, args.peak_tbps)
                print(f"{model} {layer} T={t}: " + ", ".join(f"{r['variant']} {r['us']:.1f} µs" for r in rows[-3:]),
                      flush=True)
    print()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, peak {args.peak_tbps} TB/s, "
          "median µs per call, weights from HBM (CUDA graph over rotated copies)")
    print(table(rows, args.peak_tbps))
    compiled = None if args.no_compile_check else compile_check()
    print(f"torch.compile(fullgraph=True) through the custom op: {compiled}")
    if args.out:
        args.out.write_text(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                                            peak_tbps=args.peak_tbps, compile_check=compiled, rows=rows), indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
