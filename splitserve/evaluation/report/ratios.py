"""τ ratios of DSpark runs over their DFlash baselines, with paired bootstrap intervals.

Two baselines, and every table says which one a ratio uses:
    paper-defined   DFlash (markov_rank 0, no confidence head) trained on cross-entropy alone
                    (loss=dflash_ce), the baseline of the DSpark paper: the ratio bundles the
                    Markov head, the TV loss and the confidence head
    head-only       DFlash trained on the DSpark run's own loss: the Markov head alone
A baseline matches its DSpark run in γ, draft depth, seed and training data, and must have
evaluated the same prompts (checked prompt by prompt).

The interval resamples whole prompts (each prompt keeps its rounds together), so it reflects the
prompt-to-prompt spread; τ is pooled as everywhere else: committed tokens / rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from splitserve.evaluation.report.runs import TRAINED_KEY as KEY
from splitserve.evaluation.report.runs import RunSummary, read_json

BASELINES = (("paper-defined", "dflash_ce"), ("head-only", None))  # None: the DSpark run's own loss


@dataclass
class PerPrompt:
    prompts: list[tuple[int, ...]]  # prompt ids, to check two runs measured the same prompts
    tokens: np.ndarray  # (P,) committed tokens per prompt (accepted + bonus, every round)
    rounds: np.ndarray  # (P,) rounds per prompt


@dataclass
class Ratio:
    prompt_set: str
    temperature: float
    baseline: str  # paper-defined | head-only
    run: str
    against: str
    tau: float
    tau_base: float
    ratio: float
    lo: float
    hi: float
    prompts: int


def eval_entries(run: RunSummary, main_set: str) -> dict[tuple[str, float], PerPrompt]:
    """(prompt set, temperature) -> per-prompt counts of a run's trained draft, from eval.json."""
    report = read_json(run.path / "eval.json")
    out = {}
    for name, entry in (report or {}).items():
        m = KEY.match(name)
        if not m or not isinstance(entry, dict) or "results" not in entry:
            continue
        res = entry["results"]
        out[(m["set"] or main_set, float(entry["temperature"]))] = PerPrompt(
            [tuple(r["prompt_ids"]) for r in res],
            np.array([sum(a + 1 for a in r["accepts"]) for r in res], dtype=float),
            np.array([len(r["accepts"]) for r in res], dtype=float))
    return out


def paired_ratio(a: PerPrompt, b: PerPrompt, samples: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """-> (τ_a/τ_b, 2.5th, 97.5th percentile) over prompts drawn with replacement, same draws for both."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a.tokens), size=(samples, len(a.tokens)))  # (S, P)
    ratio = (a.tokens[idx].sum(1) / a.rounds[idx].sum(1)) / (b.tokens[idx].sum(1) / b.rounds[idx].sum(1))
    point = (a.tokens.sum() / a.rounds.sum()) / (b.tokens.sum() / b.rounds.sum())
    lo, hi = np.percentile(ratio, [2.5, 97.5])
    return float(point), float(lo), float(hi)


def _set_name(run: RunSummary) -> str:
    """The main prompt set's name: "chitchat", a named set, or a prompt file's name."""
    return Path(run.heldout).name if run.heldout else "held-out"


def _match(run: RunSummary, base: RunSummary) -> bool:
    return (base.markov_rank == 0 and base.path != run.path and base.block_size == run.block_size
            and base.num_layers == run.num_layers and base.seed == run.seed and base.train_data == run.train_data)


def ratio_rows(runs: list[RunSummary], labels: dict[str, str], samples: int = 10_000) -> list[Ratio]:
    rows = []
    entries = {r.name: eval_entries(r, _set_name(r)) for r in runs if r.complete}  # each eval.json read once
    dspark = [r for r in runs if r.complete and (r.markov_rank or 0) > 0]
    for run in dspark:
        mine = entries[run.name]
        for baseline, loss in BASELINES:
            want = loss or run.loss
            if loss is None and run.loss == "dflash_ce":
                continue  # a CE-only DSpark run: its head-only baseline is the paper-defined one
            for base in (b for b in runs if b.complete and _match(run, b) and b.loss == want):
                theirs = entries[base.name]
                for key in sorted(set(mine) & set(theirs)):
                    a, b = mine[key], theirs[key]
                    if a.prompts != b.prompts or not len(a.tokens):
                        continue  # other prompts: no paired comparison
                    point, lo, hi = paired_ratio(a, b, samples)
                    rows.append(Ratio(key[0], key[1], baseline, labels[run.name], labels[base.name],
                                      a.tokens.sum() / a.rounds.sum(), b.tokens.sum() / b.rounds.sum(),
                                      point, lo, hi, len(a.tokens)))
    return rows


def ratio_table(rows: list[Ratio]) -> str:
    head = ["prompt set", "T", "baseline", "DSpark run", "against", "τ", "τ base", "ratio", "95% interval", "prompts"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(f"| {r.prompt_set} | {r.temperature:g} | {r.baseline} | {r.run} | {r.against} | {r.tau:.3f} | "
                     f"{r.tau_base:.3f} | {r.ratio:.3f} | {r.lo:.3f}–{r.hi:.3f} | {r.prompts} |")
    return "\n".join(lines)
