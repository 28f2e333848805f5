"""Paired bootstrap over held-out prompts for the greedy τ ratio of two evaluated runs.

    python bench/paired_tau_ci.py RUN_A RUN_B [--key trained] [--samples 10000]

Both runs must have evaluated the same prompts (their eval.json `results`, in the same order).
τ is pooled as in the report: committed tokens / rounds = mean over all rounds of (accepted + 1).
Resampling whole prompts keeps each prompt's rounds together, so the interval reflects the
prompt-to-prompt spread, not just round-to-round noise.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def per_prompt(run: Path, key: str) -> tuple[np.ndarray, np.ndarray]:
    """-> (committed tokens, rounds) per prompt: each (num_prompts,)."""
    results = json.loads((run / "eval.json").read_text())[key]["results"]
    tokens = np.array([sum(a + 1 for a in r["accepts"]) for r in results], dtype=float)
    rounds = np.array([len(r["accepts"]) for r in results], dtype=float)
    return tokens, rounds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_a")
    ap.add_argument("run_b")
    ap.add_argument("--key", default="trained", help="eval.json entry: trained (greedy) or trained@T=1")
    ap.add_argument("--samples", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    ta, ra = per_prompt(Path(args.run_a), args.key)
    tb, rb = per_prompt(Path(args.run_b), args.key)
    if len(ta) != len(tb):
        raise SystemExit(f"the runs evaluated different prompt counts: {len(ta)} vs {len(tb)}")
    rng = np.random.default_rng(args.seed)
    idx = rng.integers(0, len(ta), size=(args.samples, len(ta)))  # (S, P) prompts drawn with replacement
    tau_a = ta[idx].sum(1) / ra[idx].sum(1)
    tau_b = tb[idx].sum(1) / rb[idx].sum(1)
    ratio = tau_a / tau_b
    point = (ta.sum() / ra.sum()) / (tb.sum() / rb.sum())
    lo, hi = np.percentile(ratio, [2.5, 97.5])
    out = {"prompts": len(ta), "tau_a": ta.sum() / ra.sum(), "tau_b": tb.sum() / rb.sum(), "ratio": point,
           "ratio_ci95": [lo, hi], "p_ratio_ge_1.15": float((ratio >= 1.15).mean())}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
