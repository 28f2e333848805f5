"""Held-out evaluation at the end of a run: the trained draft next to an untrained one."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import torch

from splitserve.config import RunConfig
from splitserve.models.build import build_draft
from splitserve.spec.calibration import fit_report, format_fit, write_calibration
from splitserve.spec.evaluate import EvalReport, evaluate, format_reports
from splitserve.spec.plots import plot_acceptance
from splitserve.target.eos import eos_ids


def load_prompt_ids(name_or_path: str, tokenizer, limit: int | None, chat=None) -> list[list[int]]:
    """Prompt token ids, rendered with `chat` (a data.ChatTemplate; None: the tokenizer's own)."""
    from splitserve.data import ChatTemplate, encode_prompt, read_prompts, resolve_prompts_path

    prompts = read_prompts(resolve_prompts_path(name_or_path))
    if limit:
        prompts = prompts[:limit]
    return [encode_prompt(tokenizer, p, chat or ChatTemplate()) for p in prompts]


def evaluate_run(cfg: RunConfig, target, draft) -> dict[str, EvalReport]:
    """Writes eval.json, eval.md, acceptance.png (and calibration.json) into the run dir, prints the table."""
    ev = cfg.eval
    from splitserve.data import load_options

    prompts = load_prompt_ids(cfg.data.heldout_prompts, target.tokenizer, ev.num_prompts, load_options(cfg.data).chat)
    eos = eos_ids(target)
    calibrate = ev.calibrate and draft.confidence is not None
    run = partial(evaluate, engine=ev.engine)
    reports = {}
    reports["trained"] = run(target, draft, prompts, ev.max_new_tokens, ev.temperature, cfg.train.seed,
                             check_exact=ev.check_exact, eos_ids=eos, desc="eval trained", record_confidence=calibrate)
    if ev.compare_untrained:
        torch.manual_seed(cfg.train.seed)
        fresh = build_draft(draft.arch, target).eval()
        # Exactness is already checked on the trained draft; the baseline only needs its τ.
        reports["untrained"] = run(target, fresh, prompts, ev.max_new_tokens, ev.temperature,
                                   cfg.train.seed, check_exact=False, eos_ids=eos, desc="eval untrained")
    for t in ev.extra_temperatures:
        if t != ev.temperature:
            reports[f"trained@T={t:g}"] = run(target, draft, prompts, ev.max_new_tokens, t, cfg.train.seed,
                                              eos_ids=eos, desc=f"eval trained T={t:g}", record_confidence=calibrate)
    run_dir = Path(cfg.run_dir)
    table = format_reports(reports)
    (run_dir / "eval.json").write_text(json.dumps({k: r.to_dict() for k, r in reports.items()}, indent=1))
    header = (f"Held-out speculative decoding: {len(prompts)} prompts from {cfg.data.heldout_prompts}, "
              f"{ev.max_new_tokens} new tokens, T={ev.temperature}, γ={draft.arch.block_size}, "
              f"target {target.info.name}\n\n")
    (run_dir / "eval.md").write_text(header + table + "\n")
    plot_acceptance(reports, run_dir / "acceptance.png", f"{target.info.name}, γ={draft.arch.block_size}, held-out")
    print("\n" + header + table)
    if calibrate:
        fits = [f for name, r in reports.items()
                if name.startswith("trained") and (f := fit_report(r, ev.calibration_bins))]
        if fits:
            write_calibration(run_dir, fits, ev.calibration_bins,
                              source=f"{len(prompts)} held-out prompts from {cfg.data.heldout_prompts}")
            print("\n".join(format_fit(f) for f in fits))
    return reports
