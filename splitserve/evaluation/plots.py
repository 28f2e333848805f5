"""PNG plots of measurements (matplotlib, headless): acceptance by draft position, for one run's
held-out evaluation or a whole sweep, and τ against training tokens."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # report/ draws its sweep plots with this module
    from splitserve.evaluation.report.runs import RunSummary


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _label(ax, xlabel: str, ylabel: str, title: str) -> None:
    """Axis labels, a small title, a light grid, and a legend when anything was drawn."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def plot_acceptance(named: dict, path: str | Path, title: str = "held-out conditional acceptance by position") -> Path:
    """Conditional acceptance P(accept k | 1..k-1 accepted) by draft position, one line per entry.

    named: {label: a report with .per_position, .tau and optionally .temperature} (an EvalReport
    of evaluation/evaluate.py, or a sweep run's main evaluation)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for label, rep in named.items():
        ks = range(1, len(rep.per_position) + 1)
        temp = getattr(rep, "temperature", None)
        suffix = f", T={temp:g}" if temp is not None else ""
        ax.plot(ks, rep.per_position, marker="o", ms=3, label=f"{label} (τ={rep.tau:.2f}{suffix})")
    ax.set_ylim(-0.02, 1.02)
    _label(ax, "draft position k", "P(accept k | 1..k-1 accepted)", title)
    return _save(plt, fig, path)


def plot_acceptance_by_config(runs: list[RunSummary], path: Path) -> Path:
    """One line per sweep run (its main evaluation), labelled by what differs between runs."""
    from splitserve.evaluation.report.runs import config_labels

    named = {label: r.main_eval for r, label in zip(runs, config_labels(runs)) if r.main_eval is not None}
    return plot_acceptance(named, path)


def plot_tau_vs_tokens(runs: list[RunSummary], path: Path) -> Path:
    """Left: measured τ against training tokens. Each run gives its untrained draft (the same
    seed, so exactly its step-0 weights) at 0 tokens, its final checkpoint, and any other
    checkpoints measured into tau_curve.json; runs that differ only in training length join one
    line. Right: the teacher-forced mean
    acceptance α logged during training (metrics.jsonl), a cheap proxy between those points."""
    from splitserve.evaluation.report.runs import LENGTH_KEYS, config_labels

    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), dpi=120)
    lines: dict[str, list[tuple[int, float, float | None]]] = defaultdict(list)
    for r, label in zip(runs, config_labels(runs, drop=LENGTH_KEYS)):
        tau = r.tau_at(0.0)
        if tau is None or r.tokens_seen is None:
            continue
        if r.untrained is not None and r.untrained.temperature == 0.0:
            lines[label].append((0, r.untrained.tau, None))
        lines[label] += [(tokens, t, None) for tokens, t in r.tau_curve]
        lines[label].append((r.tokens_seen, tau, r.tau_at(1.0)))
    for label, pts in lines.items():
        pts = sorted(set(pts), key=lambda p: p[0])
        (line,) = left.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{label} greedy")
        t1 = [(p[0], p[2]) for p in pts if p[2] is not None]
        if t1:
            left.plot(*zip(*t1), marker="x", ls="none", color=line.get_color(), label=f"{label} T=1")
    _label(left, "training tokens (target tokens seen)", "held-out τ (tokens per target forward)",
           "measured held-out τ by checkpoint")
    for r, label in zip(runs, config_labels(runs)):
        if r.alpha_curve:
            right.plot(*zip(*r.alpha_curve), marker=".", label=label)
    _label(right, "training tokens (target tokens seen)", "teacher-forced mean α (training batches)",
           "training-time proxy (not a τ measurement)")
    return _save(plt, fig, path)
