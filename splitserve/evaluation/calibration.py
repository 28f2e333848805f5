"""Fitting a draft's STS temperatures on a draft's recorded speculative-decoding rounds.

Written beside the checkpoint (run dir) at the end of training's held-out evaluation or by
`splitserve calibrate RUN_DIR`, copied into exports. One fit per sampling temperature evaluated,
because acceptance (and so calibration) depends on it; the first fit is the primary one and
its temperatures are also written into an export's config.json as `confidence_temperatures`.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from pathlib import Path

import torch

from splitserve.evaluation.evaluate import EvalReport, evaluate
from splitserve.speculative.calibrate import fit_sts, survival_ece
from splitserve.speculative.calibration_file import write_calibration


def observations(report: EvalReport) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rounds recorded with confidences -> logits (N, γ), accepts (N,), prompt index (N,)."""
    logits, accepts, prompt = [], [], []
    for i, r in enumerate(report.results):
        for conf, n in zip(r.confidences or [], r.accepts):
            # The decoder hands out c_k = sigmoid(z_k); clamping keeps z finite where float32 saturates.
            logits.append(torch.logit(torch.tensor(conf, dtype=torch.float64), eps=1e-6))
            accepts.append(n)
            prompt.append(i)
    if not logits:
        return torch.zeros(0, report.block_size, dtype=torch.float64), torch.zeros(0, dtype=torch.long), torch.zeros(0)
    return torch.stack(logits), torch.tensor(accepts), torch.tensor(prompt)


def _crossfit_ece(logits, accepts, prompt, n_bins: int) -> float | None:
    """Pooled ECE when each half of the prompts is scored with temperatures fitted on the other half."""
    halves = [prompt % 2 == 0, prompt % 2 == 1]
    if not all(h.any() for h in halves):
        return None
    abs_err = 0.0
    for fit_on, score_on in (halves, halves[::-1]):
        temps = fit_sts(logits[fit_on], accepts[fit_on], n_bins=n_bins)
        err, _ = survival_ece(logits[score_on], accepts[score_on], temps, n_bins)
        abs_err += err * int(score_on.sum())
    return abs_err / len(prompt)


def fit_report(report: EvalReport, n_bins: int = 10) -> dict | None:
    """One STS fit on a report recorded with `record_confidence`; None without observations."""
    logits, accepts, prompt = observations(report)
    if len(accepts) == 0:
        return None
    temps = fit_sts(logits, accepts, n_bins=n_bins)
    before, before_pos = survival_ece(logits, accepts, None, n_bins)
    after, after_pos = survival_ece(logits, accepts, temps, n_bins)
    return {
        "sampling_temperature": report.temperature,
        "temperatures": [round(float(t), 4) for t in temps],
        "rounds": len(accepts),
        "num_prompts": report.num_prompts,
        "ece_before": before,
        "ece_after": after,
        "ece_after_crossfit": _crossfit_ece(logits, accepts, prompt, n_bins),
        "ece_before_per_position": before_pos,
        "ece_after_per_position": after_pos,
    }


def format_fit(fit: dict) -> str:
    cv = fit["ece_after_crossfit"]
    return (f"STS calibration at T={fit['sampling_temperature']:g} ({fit['rounds']} rounds): prefix-survival ECE "
            f"{fit['ece_before']:.4f} -> {fit['ece_after']:.4f}"
            + (f" (cross-fitted over prompt halves {cv:.4f})" if cv is not None else "")
            + "; temperatures " + ", ".join(f"{t:.2f}" for t in fit["temperatures"]))


def calibrate_run(
    out_dir: str | Path,
    target,
    draft,
    prompts: list[list[int]],
    sampling_temperatures: list[float],
    max_new_tokens: int,
    seed: int = 0,
    n_bins: int = 10,
    eos_ids: AbstractSet[int] | None = None,
    source: str = "",
) -> list[dict]:
    """Decode the prompts speculatively at each sampling temperature, fit STS, write calibration.json."""
    if draft.confidence is None:
        raise ValueError("this draft has no confidence head (enable_confidence_head=false): nothing to calibrate")
    fits = []
    for t in sampling_temperatures:
        rep = evaluate(target, draft, prompts, max_new_tokens, t, seed, check_exact=False, eos_ids=eos_ids,
                       desc=f"calibrate T={t:g}", record_confidence=True)
        fit = fit_report(rep, n_bins)
        if fit is not None:
            fits.append(fit)
    if not fits:
        raise ValueError("no speculative rounds were recorded (empty prompts or max_new_tokens too small)")
    write_calibration(out_dir, fits, n_bins, source)
    return fits
