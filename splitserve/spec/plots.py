"""PNG plots of evaluation results (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path


def plot_acceptance(named: dict, path: str | Path, title: str = "") -> Path:
    """Conditional acceptance by draft position, one line per report (EvalReport-like)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    for name, rep in named.items():
        ks = list(range(1, len(rep.per_position) + 1))
        ax.plot(ks, rep.per_position, marker="o", label=f"{name} (τ={rep.tau:.2f})")
    ax.set_xlabel("draft position k")
    ax.set_ylabel("P(accept k | 1..k-1 accepted)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)
