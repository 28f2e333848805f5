"""What FP8 draft weights cost in acceptance: one trained draft, decoded on the same held-out
prompts as it is and as the engine's FP8 copy (speculative/draft_weights.py), against the real
target in float32.

    python bench/draft_fp8_tau.py RUN_DIR [--num-prompts 50] [--max-new-tokens 48] [--device cuda] [--out FILE]

Both are lossless (exactness is checked for both); only τ may differ. Prints both tables, the
paired τ ratio FP8 / model with a 95% bootstrap interval over prompts, and how many prompts
drafted differently at all.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from splitserve.config import ModelsConfig
from splitserve.evaluation.evaluate import EvalReport, evaluate, format_reports
from splitserve.evaluation.heldout import load_prompt_ids
from splitserve.evaluation.report.ratios import PerPrompt, paired_ratio
from splitserve.loading import load_models, read_draft_meta
from splitserve.speculative.draft_weights import served_draft


def per_prompt(report: EvalReport) -> PerPrompt:
    """A report's per-prompt committed tokens and rounds, as the sweep report pairs them."""
    res = report.results
    return PerPrompt([tuple(r.prompt_ids) for r in res], np.array([sum(a + 1 for a in r.accepts) for r in res], float),
                     np.array([len(r.accepts) for r in res], float))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--prompts", default="chitchat")
    ap.add_argument("--num-prompts", type=int, default=50)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--device", default="cpu", help="the target and draft stay float32 on any device")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    meta = read_draft_meta(args.run_dir)
    target, draft = load_models(ModelsConfig(draft=args.run_dir, device=args.device, dtype="float32"), meta)
    prompts = load_prompt_ids(args.prompts, target.tokenizer, args.num_prompts)
    eos = target.eos_ids()
    reports = {"model weights": evaluate(target, draft, prompts, args.max_new_tokens, eos_ids=eos, desc="model"),
               "fp8 weights": evaluate(target, served_draft(draft, "fp8"), prompts, args.max_new_tokens, eos_ids=eos,
                                       desc="fp8")}
    a, b = reports["model weights"], reports["fp8 weights"]
    point, lo, hi = paired_ratio(per_prompt(b), per_prompt(a))  # fp8 / model
    moved = sum(x.accepts != y.accepts for x, y in zip(a.results, b.results))
    print(format_reports(reports))
    print(f"τ fp8 / model {point:.3f} (95% interval {lo:.3f}–{hi:.3f}); {moved} of {len(prompts)} prompts drafted "
          "differently")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({k: r.to_dict(with_results=False) for k, r in reports.items()}
                      | {"ratio": [point, lo, hi], "prompts_drafted_differently": moved}, f, indent=1)


if __name__ == "__main__":
    main()
