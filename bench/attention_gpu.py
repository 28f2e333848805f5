"""Decode / verify attention over the static KV cache on a GPU: the Triton kernel
(target/native/attention_kernel.py) against the reference (SDPA with the groups folded into the
query axis, target/native/attention.py), each replayed from a CUDA graph as the engine runs them.

    PYTHONPATH=. python bench/attention_gpu.py --out attention_h200.json [--sliding-window 4096] [--splits 1 2 4 8 16]
        [--tune 64:2 128:3] [--shapes 8b] [--queries 17] [--windows 8192]

Shapes: an 8B-class target (32 query / 8 kv heads, hd 128) and SmolLM2-135M (9 / 3, hd 64), bf16,
T = 1 (decode) and 17 (a verify block of γ = 16) queries at the window's last positions (every
slot visible), windows 256 to 8192. One graph holds CALLS calls or more: the calls cycle over
enough copies of the cache that they do not all fit in L2, as a model's layers do not. The time
is the median over replays, per call; the error is the max abs difference of the two outputs.
--splits also times the kernel at each forced split count (the plan's choice is "splits"), to
check the plan against the best count. --tune times the kernel at forced launch shapes too,
each BLOCK_M:STAGES (the row tile, and the software pipelining depth of its K/V loads; 0 leaves
that one to the plan), with the plan's split count.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from splitserve.target.native import attention, attention_kernel

SHAPES = {"8b": (32, 8, 128), "smollm2": (9, 3, 64)}  # name: (Hq, Hkv, hd)
QUERIES = (1, 17)
WINDOWS = (256, 512, 2048, 8192)
CALLS = 20
COLD_BYTES = 256 << 20  # K/V read by one graph replay: past an H200's L2 (50 MB)
REPLAYS = 15


def graph_of(calls: list) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: Triton compiles, SDPA picks its kernel, outside the capture
        for fn in calls[:2]:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    return graph


def time_per_call(graph: torch.cuda.CUDAGraph, n_calls: int) -> float:
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / n_calls)  # ms -> µs
    return statistics.median(times)


def tune_name(block_m: int, stages: int) -> str:
    """The implementation name of a forced BLOCK_M:STAGES launch shape (0: the plan's)."""
    return f"triton_m{block_m}_st{stages}"


def measure(Hq: int, Hkv: int, hd: int, T: int, window: int, sliding_window: int | None,
            forced_splits: tuple[int, ...] = (), tunings: tuple[tuple[int, int], ...] = ()) -> dict:
    dev, dt = torch.device("cuda"), torch.bfloat16
    kv_bytes = 2 * Hkv * window * hd * dt.itemsize
    copies = min(-(-COLD_BYTES // kv_bytes), 1000)
    n_calls = max(CALLS, copies)
    # The kernel reads q through strides: hand it the fused qkv projection's view, as the model does.
    q = torch.randn(T, (Hq + 2 * Hkv) * hd, device=dev, dtype=dt)[:, :Hq * hd].view(T, Hq, hd)
    caches = [(torch.randn(Hkv, window, hd, device=dev, dtype=dt), torch.randn(Hkv, window, hd, device=dev, dtype=dt))
              for _ in range(copies)]
    positions = torch.arange(window - T, window, device=dev)
    scale = hd**-0.5
    impls = {"triton": attention_kernel.decode_attention_triton, "reference": attention.decode_attention}
    for n in forced_splits:
        impls[f"triton_s{n}"] = lambda *a, n=n: attention_kernel.decode_attention_triton(*a, num_splits=n)
    for m, st in tunings:
        impls[tune_name(m, st)] = lambda *a, m=m, st=st: attention_kernel.decode_attention_triton(
            *a, row_tile=m or None, num_stages=st or None)
    row = {}
    outs = {name: fn(q, *caches[0], positions, window, scale, sliding_window).float() for name, fn in impls.items()}
    row["max_abs_err"] = max((out - outs["reference"]).abs().max().item() for name, out in outs.items() if name != "reference")
    for name, fn in impls.items():
        calls = [lambda i=i: fn(q, *caches[i % copies], positions, window, scale, sliding_window)
                 for i in range(n_calls)]
        row[f"{name}_us"] = time_per_call(graph_of(calls), n_calls)
        torch.cuda.synchronize()
    _, _, row_blocks, splits, _ = attention_kernel.plan(T * Hq // Hkv, Hkv, hd, window, dev)
    row.update(splits=splits, row_blocks=row_blocks, calls_per_graph=n_calls, cache_copies=copies)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--sliding-window", type=int, default=None)
    ap.add_argument("--splits", type=int, nargs="*", default=[], help="forced split counts to time too")
    ap.add_argument("--tune", nargs="*", default=[], help="forced BLOCK_M:STAGES launch shapes to time too")
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--queries", type=int, nargs="*", default=list(QUERIES))
    ap.add_argument("--windows", type=int, nargs="*", default=list(WINDOWS))
    args = ap.parse_args()
    tunings = tuple(tuple(int(x) for x in tune.split(":")) for tune in args.tune)  # (BLOCK_M, STAGES)
    assert torch.cuda.is_available() and attention_kernel.HAS_TRITON, "needs a CUDA GPU and triton"
    import triton

    torch.manual_seed(0)
    results = []
    print("| shape | T | window | triton µs | reference µs | speedup | splits | best forced: splits, µs | max abs err |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for shape in args.shapes:
        Hq, Hkv, hd = SHAPES[shape]
        for T in args.queries:
            for window in args.windows:
                r = dict(shape=shape, Hq=Hq, Hkv=Hkv, hd=hd, T=T, window=window,
                         **measure(Hq, Hkv, hd, T, window, args.sliding_window, tuple(args.splits), tunings))
                results.append(r)
                forced = {n: r[f"triton_s{n}_us"] for n in args.splits}
                best = min(forced, key=forced.get) if forced else None
                best_cell = f"{best}, {forced[best]:.1f}" if forced else "-"
                print(f"| {shape} | {T} | {window} | {r['triton_us']:.1f} | {r['reference_us']:.1f} | "
                      f"{r['reference_us'] / r['triton_us']:.2f}x | {r['splits']} | {best_cell} | "
                      f"{r['max_abs_err']:.2e} |", flush=True)
                for m, st in tunings:
                    print(f"|   forced BLOCK_M {m or 'plan'}, stages {st or 'plan'} | {T} | {window} | "
                          f"{r[tune_name(m, st) + '_us']:.1f} | | | | | |", flush=True)
    summary = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "dtype": "bfloat16", "sliding_window": args.sliding_window, "results": results}
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
