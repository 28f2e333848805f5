"""The sweep's Markdown table: one row per run, incomplete runs included and marked."""

from __future__ import annotations

from splitserve.evaluation.report.runs import RunSummary, config_labels


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _acceptance(r: RunSummary) -> str:
    ev = r.main_eval
    return "-" if ev is None else " ".join(f"{a:.2f}" for a in ev.per_position)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _ece(r: RunSummary) -> str:
    if r.ece_before is None or r.ece_after is None:
        return "-"
    return f"{r.ece_before:.3f} → {r.ece_after:.3f}"


COLUMNS = ["run", "draft", "γ", "markov rank", "loss", "layers", "tokens trained", "steps", "τ greedy",
           "τ untrained", "τ T=1", "acceptance a1..aγ", "conf. ECE (STS)", "train time", "status"]


def table_rows(runs: list[RunSummary]) -> list[list[str]]:
    """One row per run, named by the overrides that set it apart (the directory names are long)."""
    rows = []
    for r, label in zip(runs, config_labels(runs)):
        rows.append([
            label, r.draft or "-", _fmt(r.block_size, "d"), _fmt(r.markov_rank, "d"), r.loss or "-",
            _fmt(r.num_layers, "d"), _fmt(r.tokens_seen, ","), _fmt(r.steps, "d"), _fmt(r.tau_at(0.0), ".3f"),
            _fmt(r.untrained.tau if r.untrained else None, ".3f"), _fmt(r.tau_at(1.0), ".3f"), _acceptance(r), _ece(r),
            _duration(r.elapsed_s), r.status,
        ])
    return rows


def markdown_table(runs: list[RunSummary]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in table_rows(runs)]
    return "\n".join(lines)
