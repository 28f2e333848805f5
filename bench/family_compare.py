"""The draft-family comparison's table and plot, from bench/family_compare_gpu.sh's results.

    python bench/family_compare.py RESULTS [--baseline eagle3] [--out DIR]

RESULTS holds seed<k>/sweep.tar.gz (each run's eval.json and config, from `... eval`) and
bench/<run>.json (`splitserve bench` of each family's seed-0 draft, from `... bench`). Writes
DIR/families.md (three tables) and DIR/families.png:

  held-out τ     per family, prompt set (chitchat, HumanEval, MT-Bench) and temperature, both
                 seeds pooled (committed tokens / rounds over both), each seed's own τ beside it
  paired ratio   each family's τ over the baseline family's, with a 95% interval from resampling
                 whole prompts (both seeds' rounds of a prompt stay together; splitserve's
                 evaluation/report/ratios.py, the same resampling as every other ratio we report)
  serving        `splitserve bench` on held-out chat prompts, batch 1, greedy, EOS ignored: accept
                 length, TPOT against the engine's AR, and the round's cost in AR decode steps
                 (TPOT × accept length / AR TPOT: the draft plus the γ+1-token verify)
"""

from __future__ import annotations

import argparse
import json
import re
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from splitserve.evaluation.report.ratios import PerPrompt, eval_entries, paired_ratio
from splitserve.evaluation.report.runs import read_run

SETS = (("chitchat", "chitchat"), ("humaneval", "HumanEval"), ("mtbench", "MT-Bench"))
TEMPS = (0.0, 1.0)


def family_of(run_name: str) -> str:
    """'3_draft=dspark_b16,loss=prefix' -> 'dspark_b16'; DFlash's CE-only run -> 'dflash_b16 (CE)'."""
    draft = run_name.split("draft=")[1].split(",")[0]
    return f"{draft} (CE)" if "loss=dflash_ce" in run_name else draft


def read_seeds(results: Path, tmp: Path) -> dict[str, dict[int, tuple]]:
    """family -> seed -> (RunSummary, {(set, T): PerPrompt})."""
    out: dict[str, dict[int, tuple]] = {}
    for archive in sorted(results.glob("seed*/sweep.tar.gz")):
        seed = int(archive.parent.name.removeprefix("seed"))
        dest = tmp / archive.parent.name
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="data")
        sweep = dest / "sweep"
        for run_dir in sorted(d for d in sweep.iterdir() if (d / "eval.json").exists()):
            run = read_run(run_dir, sweep)
            out.setdefault(family_of(run_dir.name), {})[seed] = (run, eval_entries(run, "chitchat"))
    return out


def pooled(entries: list[PerPrompt]) -> PerPrompt:
    """Several seeds' counts on the same prompts summed prompt by prompt."""
    first = entries[0]
    for e in entries[1:]:
        if e.prompts != first.prompts:
            raise SystemExit("the seeds evaluated different prompts; cannot pair them")
    return PerPrompt(first.prompts, np.sum([e.tokens for e in entries], 0), np.sum([e.rounds for e in entries], 0))


def tokens_seen(run) -> int:
    """Target tokens trained on: the checkpoint's state.json, else the last metrics row (the view
    of the run at the evaluated step holds only rows up to it)."""
    if run.tokens_seen:
        return int(run.tokens_seen)
    rows = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return int(rows[-1]["tokens_seen"]) if rows else 0


def tau(e: PerPrompt) -> float:
    return float(e.tokens.sum() / e.rounds.sum())


def tau_table(fams: dict, order: list[str]) -> tuple[str, dict]:
    head = "| family | γ | layers | target tokens | " + " | ".join(f"{label} T={t:g}" for _, label in SETS for t in TEMPS)
    lines = [head + " |", "|---" * (4 + len(SETS) * len(TEMPS)) + "|"]
    pooled_by = {}
    for fam in order:
        seeds = fams[fam]
        run = seeds[min(seeds)][0]
        cells = []
        for key in ((s, t) for s, _ in SETS for t in TEMPS):
            per_seed = [seeds[k][1][key] for k in sorted(seeds) if key in seeds[k][1]]
            if not per_seed:
                cells.append("-")
                continue
            p = pooled(per_seed)
            pooled_by[(fam, key)] = p
            cells.append(f"**{tau(p):.3f}** ({', '.join(f'{tau(e):.3f}' for e in per_seed)})")
        tokens = ", ".join(f"{tokens_seen(seeds[k][0]) / 1e6:.2f}M" for k in sorted(seeds))
        lines.append(f"| {fam} | {run.block_size} | {run.num_layers} | {tokens} | " + " | ".join(cells) + " |")
    return "\n".join(lines), pooled_by


def ratio_table(pooled_by: dict, order: list[str], baseline: str, samples: int) -> str:
    head = "| family / " + baseline + " | " + " | ".join(f"{label} T={t:g}" for _, label in SETS for t in TEMPS)
    lines = [head + " |", "|---" * (1 + len(SETS) * len(TEMPS)) + "|"]
    for fam in order:
        if fam == baseline:
            continue
        cells = []
        for key in ((s, t) for s, _ in SETS for t in TEMPS):
            a, b = pooled_by.get((fam, key)), pooled_by.get((baseline, key))
            if a is None or b is None:
                cells.append("-")
                continue
            point, lo, hi = paired_ratio(a, b, samples)
            bold = "**" if lo > 1 or hi < 1 else ""
            cells.append(f"{bold}{point:.3f}{bold} [{lo:.3f}, {hi:.3f}]")
        lines.append(f"| {fam} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bench_table(results: Path, order: list[str]) -> tuple[str, dict]:
    rows, ar, heading = {}, None, ""
    for path in sorted((results / "bench").glob("*.json")):
        report = json.loads(path.read_text())
        fam = family_of(path.stem)
        rows[fam] = report["results"]["engine spec"]
        ar = report["results"].get("engine AR", ar)
        heading = heading or re.sub(r", γ=\d+", "", report.get("heading", ""))  # γ differs by family
    if not rows:
        return "(no bench results)", {}
    lines = ["| family | γ | accept length | acceptance a1..aγ | spec TPOT ms (mean / p99) | AR TPOT ms | speedup | "
             "round ms | round in AR steps | output equal to AR |", "|---" * 10 + "|"]
    out = {}
    for fam in order:
        r = rows.get(fam)
        if r is None:
            continue
        acc = r["per_position_acceptance"]
        round_ms = r["mean_tpot_ms"] * r["mean_accept_length"]
        steps = round_ms / ar["mean_tpot_ms"] if ar else float("nan")
        speed = ar["mean_tpot_ms"] / r["mean_tpot_ms"] if ar else float("nan")
        out[fam] = dict(tpot=r["mean_tpot_ms"], accept=r["mean_accept_length"], speedup=speed, round_steps=steps)
        exact = f"{r['exact_vs_ar']}/{r['num_requests']}" if r.get("exact_vs_ar") is not None else "-"
        lines.append(f"| {fam} | {len(acc)} | {r['mean_accept_length']:.3f} | {' '.join(f'{a:.2f}' for a in acc)} | "
                     f"{r['mean_tpot_ms']:.3f} / {r['p99_tpot_ms']:.3f} | {ar['mean_tpot_ms']:.3f} | "
                     f"{speed:.2f}× | {round_ms:.3f} | {steps:.2f} | {exact} |")
    return heading + "\n\n" + "\n".join(lines), out


def seeds_pooled(fams: dict) -> str:
    """'both seeds pooled', '3 seeds pooled' or 'one seed (0)': what a pooled τ here stands for."""
    seeds = sorted({s for by_seed in fams.values() for s in by_seed})
    if len(seeds) == 1:
        return f"one seed ({seeds[0]})"
    return ("both" if len(seeds) == 2 else str(len(seeds))) + " seeds pooled"


def plot(pooled_by: dict, served: dict, order: list[str], path: Path, pooled_label: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = [f for f in order if f in served]
    if fams:
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [3, 1.3]})
    else:  # a τ-only run: no served panel
        fig, ax = plt.subplots(figsize=(9.5, 4.5))
    keys = [(s, t) for s, _ in SETS for t in TEMPS]
    width = 0.8 / len(order)
    for i, fam in enumerate(order):
        vals = [tau(pooled_by[(fam, k)]) if (fam, k) in pooled_by else 0 for k in keys]
        ax.bar(np.arange(len(keys)) + i * width, vals, width, label=fam)
    ax.set_xticks(np.arange(len(keys)) + width * (len(order) - 1) / 2)
    ax.set_xticklabels([f"{label}\nT={t:g}" for _, label in SETS for t in TEMPS])
    ax.set_ylim(bottom=1.0)  # τ counts the bonus token: 1 is drafting nothing
    ax.set_ylabel(f"held-out τ ({pooled_label})")
    ax.set_title("acceptance length by prompt set")
    ax.legend(fontsize=8)
    if fams:
        bx.bar(fams, [served[f]["speedup"] for f in fams], color=[f"C{order.index(f)}" for f in fams])
        bx.axhline(1.0, color="gray", lw=0.8)
        bx.set_ylabel("TPOT speedup over the engine's AR")
        bx.set_title("served, batch 1 (seed 0)")
        bx.tick_params(axis="x", rotation=30, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", type=Path)
    ap.add_argument("--baseline", default="eagle3", help="the family every ratio divides by")
    ap.add_argument("--samples", type=int, default=10_000)
    ap.add_argument("--out", type=Path, default=None, help="default: RESULTS")
    args = ap.parse_args()
    out = args.out or args.results
    with tempfile.TemporaryDirectory() as tmp:
        fams = read_seeds(args.results, Path(tmp))
        if not fams:
            raise SystemExit(f"no seed*/sweep.tar.gz under {args.results}")
        order = sorted(fams, key=lambda f: (f.startswith("eagle3"), f.startswith("dflash"), f))
        taus, pooled_by = tau_table(fams, order)
        ratios = ratio_table(pooled_by, order, args.baseline, args.samples) if args.baseline in fams else ""
    serving, served = bench_table(args.results, order)
    label = seeds_pooled(fams)
    md = (f"### Held-out τ (bold: {label}; in brackets: seed by seed)\n\n{taus}\n\n"
          f"### τ over {args.baseline}'s, paired 95% intervals over prompts\n\n{ratios}\n\n"
          f"### Served by `splitserve bench`\n\n{serving}\n")
    (out / "families.md").write_text(md)
    plot(pooled_by, served, order, out / "families.png", label)
    print(md)
    print(f"wrote {out / 'families.md'} and {out / 'families.png'}")


if __name__ == "__main__":
    main()
