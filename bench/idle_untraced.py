"""GPU idle inside a speculative round without the tracer's own gaps, from saved profiles.

    python bench/idle_untraced.py FILE.json [FILE.json ...]

`round_profile.idle_profile` traces one request and reports the idle share of the traced window.
Tracing kernels inside CUDA graphs slows the replay itself: the traced round is longer than the
same round untraced (the `spec` requests' wall time per round), and the difference shows up as
gaps between kernels. Kernel durations are GPU timestamps, so the busy time per round is kept,
and the idle share is taken against the untraced wall time per round instead:

    idle = 1 - (GPU busy per round, traced) / (wall time per round, untraced requests)

It still counts every gap a user pays for (inside the graphs and between rounds). Reads the JSON
of `bench/round_profile.py` ({"profile", "spec"}) and of `bench/engine_floor_gpu.py` (per shape
and variant, from the runs that saved `gpu_busy_us_per_round`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def traced_us_per_round(profile: dict) -> float:
    """The traced window of a round_profile.idle_profile result, per round (µs)."""
    return profile["window_us"] / max(profile["rounds"], 1)


def untraced_idle(busy_us: float, untraced_us: float) -> float:
    """The idle share of a round: traced GPU busy time against the untraced wall time (both µs)."""
    return 1 - busy_us / untraced_us


def rows_of(path: Path) -> list[dict]:
    """(name, kernels, busy, traced, untraced, traced idle) per profiled round in one file."""
    data = json.loads(path.read_text())
    if "profile" in data:  # round_profile.py
        p = data["profile"]
        return [dict(name=path.name, kernels=p["kernels_per_round"], busy_us=p["gpu_us_per_round"],
                     traced_us=traced_us_per_round(p), untraced_us=1000 * data["spec"]["wall_per_step_ms"],
                     traced_idle=p["gpu_idle_fraction"])]
    rows = []
    for shape, res in data.get("shapes", {}).items():  # engine_floor_gpu.py
        for variant, v in res["variants"].items():
            if v.get("gpu_busy_us_per_round") is None:
                continue
            rows.append(dict(name=f"{path.name}: {shape} {variant}", kernels=v["kernels_per_round"],
                             busy_us=v["gpu_busy_us_per_round"], traced_us=v["traced_us_per_round"],
                             untraced_us=1000 * v["spec"]["wall_per_step_ms"], traced_idle=v["gpu_idle_fraction"]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args()
    print("| profile | kernels / round | GPU busy / round (traced) | round, traced | round, untraced "
          "| idle, traced | **idle, untraced** | tracer's cost per kernel |")
    print("|---|---|---|---|---|---|---|---|")
    for path in args.files:
        rows = rows_of(path)
        if not rows:
            print(f"| {path.name} | no busy time per round saved | | | | | | |")
        for r in rows:
            idle = untraced_idle(r["busy_us"], r["untraced_us"])
            per_kernel = (r["traced_us"] - r["untraced_us"]) / r["kernels"]
            print(f"| {r['name']} | {r['kernels']:.0f} | {r['busy_us']:.0f} µs | {r['traced_us']:.0f} µs "
                  f"| {r['untraced_us']:.0f} µs | {100 * r['traced_idle']:.1f}% | **{100 * idle:.1f}%** "
                  f"| {per_kernel:.2f} µs |")


if __name__ == "__main__":
    main()
