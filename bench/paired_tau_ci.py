"""Paired bootstrap over held-out prompts for the greedy τ ratio of two evaluated runs.

    python bench/paired_tau_ci.py RUN_A RUN_B [--key trained | trained@T=1 | trained[humaneval]@T=1] [--samples 10000]
    python bench/paired_tau_ci.py RUN_A RUN_B --all      (a Markdown row per prompt set and temperature)

Both runs must have evaluated the same prompts (their eval.json `results`, in the same order).
τ is pooled as in the report: committed tokens / rounds = mean over all rounds of (accepted + 1).
Resampling whole prompts keeps each prompt's rounds together, so the interval reflects the
prompt-to-prompt spread, not just round-to-round noise.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from splitserve.evaluation.report.ratios import KEY, eval_entries, paired_ratio
from splitserve.evaluation.report.runs import read_run


def print_table(args) -> None:
    """A Markdown row per (prompt set, temperature) that both runs evaluated on the same prompts."""
    a_all, b_all = (eval_entries(read_run(Path(p), Path(p)), "main") for p in (args.run_a, args.run_b))
    print(f"{Path(args.run_a).name} / {Path(args.run_b).name}\n")
    print("| prompt set | T | τ A | τ B | ratio | 95% interval | prompts |\n|---|---|---|---|---|---|---|")
    for key in sorted(set(a_all) & set(b_all), key=lambda k: (k[0] != "main", k)):
        a, b = a_all[key], b_all[key]
        if a.prompts != b.prompts:
            print(f"| {key[0]} | {key[1]:g} | different prompts | | | | |")
            continue
        point, lo, hi = paired_ratio(a, b, args.samples, args.seed)
        bold = "**" if lo > 1 or hi < 1 else ""
        tau_a, tau_b = a.tokens.sum() / a.rounds.sum(), b.tokens.sum() / b.rounds.sum()
        print(f"| {key[0]} | {key[1]:g} | {tau_a:.3f} | {tau_b:.3f} "
              f"| {bold}{point:.3f}{bold} | {lo:.3f}–{hi:.3f} | {len(a.tokens)} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_a")
    ap.add_argument("run_b")
    ap.add_argument("--key", default="trained", help="eval.json entry: trained (greedy), trained@T=1, "
                    "trained[humaneval]@T=1, ...")
    ap.add_argument("--samples", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--all", action="store_true", help="every (prompt set, T) entry both runs measured, as a table")
    args = ap.parse_args()
    if args.all:
        print_table(args)
        return
    m = KEY.match(args.key)
    if not m:
        raise SystemExit(f"--key {args.key!r} is not a trained entry of eval.json")
    key = (m["set"] or "main", float(m["t"] or 0.0))  # no @T: the greedy entry
    pick = []
    for path in (args.run_a, args.run_b):
        entries = eval_entries(read_run(Path(path), Path(path)), "main")
        if key not in entries:
            raise SystemExit(f"{path}: no {args.key} entry in eval.json")
        pick.append(entries[key])
    a, b = pick
    if a.prompts != b.prompts:
        raise SystemExit(f"the runs evaluated different prompts: {len(a.prompts)} vs {len(b.prompts)}")
    point, lo, hi = paired_ratio(a, b, args.samples, args.seed)
    out = {"prompts": len(a.tokens), "tau_a": a.tokens.sum() / a.rounds.sum(), "tau_b": b.tokens.sum() / b.rounds.sum(),
           "ratio": point, "ratio_ci95": [lo, hi]}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
