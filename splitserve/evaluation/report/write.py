"""`splitserve report SWEEP_DIR`: report.md, report.json and two PNG plots in the sweep dir."""

from __future__ import annotations

import json
import os
from pathlib import Path

from splitserve.evaluation.plots import plot_acceptance_by_config, plot_tau_vs_tokens
from splitserve.evaluation.report.ratios import ratio_rows, ratio_table
from splitserve.evaluation.report.runs import RunSummary, config_labels, read_sweep, read_yaml
from splitserve.evaluation.report.table import COLUMNS, markdown_table, table_rows

ACCEPTANCE_PNG = "report_acceptance.png"
TAU_PNG = "report_tau_tokens.png"

NOTES = """\
- τ is measured, never estimated: tokens committed per target forward (bonus included) of real
  speculative decoding against the target on the run's held-out prompts (eval.json). "τ greedy"
  is T=0, "τ T=1" is rejection sampling at T=1 (present when the run set
  `eval.extra_temperatures=[1.0]` or evaluated at T=1). "τ untrained" is the same draft
  architecture at its initial weights.
- acceptance a1..aγ: conditional acceptance P(accept k | 1..k-1 accepted) per draft position of
  the trained draft, greedy when measured.
- conf. ECE (STS): ECE of the confidence head's prefix survival prod c_i against observed prefix
  acceptance, before → after Sequential Temperature Scaling (calibration.json, fit on the
  same held-out rounds; calibration.json also has a cross-fitted value).
- τ against training tokens: each run contributes its untrained draft (the same seed, hence
  exactly its step-0 weights) at 0 tokens, its final checkpoint, and the greedy τ of any other
  checkpoints measured into the run's tau_curve.json (keep them with
  `train.keep_checkpoints=0`). Runs differing only in `train.max_steps`/`train.max_minutes`
  join one line too. The right panel is the teacher-forced
  mean α from metrics.jsonl, a training-time proxy, not a τ measurement.
- train time: training wall time from the latest checkpoint's state.json (evaluation excluded).
"""


RATIO_NOTES = """\
Measured τ of each DSpark run over a DFlash baseline of the same γ, depth, seed and data, on the
same prompts. **paper-defined**: DFlash trained on cross-entropy alone (`loss=dflash_ce`, no
confidence head), the DSpark paper's baseline; the ratio bundles the Markov head, the TV loss and
the confidence head. **head-only**: DFlash trained on the DSpark run's own loss; the ratio is the
Markov head alone. The interval is a paired bootstrap over prompts (95%)."""


def _sweep_overrides(sweep_dir: Path) -> list[str]:
    """The sweep's task overrides from Hydra's multirun.yaml, read as plain YAML like the runs'
    own config files, so the report builds without Hydra installed."""
    raw = read_yaml(sweep_dir / "multirun.yaml")  # None when missing or unreadable
    try:
        return [str(o) for o in raw["hydra"]["overrides"]["task"] or []]
    except (KeyError, TypeError):
        return []  # an unreadable multirun.yaml only costs the header line


def render_markdown(sweep_dir: Path, runs: list[RunSummary]) -> str:
    done = sum(r.complete for r in runs)
    out = [f"# Sweep report: {sweep_dir.name}", "",
           f"{len(runs)} runs, {done} complete, {len(runs) - done} incomplete."]
    overrides = _sweep_overrides(sweep_dir)
    if overrides:
        out.append("Sweep overrides: " + " ".join(f"`{o}`" for o in overrides))
    out += ["", markdown_table(runs), "", f"![acceptance by position]({ACCEPTANCE_PNG})", "",
            f"![τ against training tokens]({TAU_PNG})", ""]
    ratios = ratio_rows(runs, dict(zip((r.name for r in runs), config_labels(runs))))
    if ratios:
        out += ["## DSpark over DFlash", "", RATIO_NOTES, "", ratio_table(ratios), ""]
    incomplete = [r for r in runs if not r.complete]
    if incomplete:
        out += ["## Incomplete runs", ""] + [f"- `{r.name}`: {r.status.removeprefix('incomplete: ')}"
                                             for r in incomplete] + [""]
    out += ["## How to read it", "", NOTES]
    return "\n".join(out)


def _log_wandb(sweep_dir: Path, runs: list[RunSummary], project: str) -> None:
    os.environ.setdefault("WANDB_MODE", "offline")
    try:
        import wandb
    except ImportError as exc:
        raise RuntimeError("report --wandb needs wandb: pip install 'splitserve[wandb]'") from exc

    run = wandb.init(project=project, dir=str(sweep_dir), name=f"report-{sweep_dir.name}", job_type="report",
                     config={"sweep": sweep_dir.name, "runs": len(runs)})
    run.log({"sweep_table": wandb.Table(columns=COLUMNS, data=table_rows(runs)),
             "acceptance_by_position": wandb.Image(str(sweep_dir / ACCEPTANCE_PNG)),
             "tau_vs_tokens": wandb.Image(str(sweep_dir / TAU_PNG))})
    run.finish()


def write_report(sweep_dir: str | Path, wandb: bool = False, wandb_project: str = "splitserve") -> Path:
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"{sweep_dir} is not a directory")
    runs = read_sweep(sweep_dir)
    plot_acceptance_by_config(runs, sweep_dir / ACCEPTANCE_PNG)
    plot_tau_vs_tokens(runs, sweep_dir / TAU_PNG)
    (sweep_dir / "report.json").write_text(json.dumps([r.to_dict() for r in runs], indent=1))
    path = sweep_dir / "report.md"
    path.write_text(render_markdown(sweep_dir, runs))
    if wandb:
        _log_wandb(sweep_dir, runs, wandb_project)
    return path
