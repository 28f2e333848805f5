"""Held-out τ per context-length bucket for several drafts in one table and one plot (issue 43
item 5: a draft trained at 2K against one trained at 8K or longer, on the same target).

Each draft is first measured by `splitserve eval --length-buckets ... --out DIR`; this merges
their lengths.json files:

    python bench/tau_by_length.py DIR_A/lengths.json DIR_B/lengths.json --names "trained at 2K" \
        "trained at 8K" --out docs/results/lengths_h200

-> OUT/lengths.md, OUT/lengths.json, OUT/lengths.png.

`--from-table lengths.md` instead redraws the table and plot from a Markdown table of that form
(what a run printed, when its files were not kept): τ, rounds, prompts and exact counts only.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from splitserve.evaluation import length_buckets as lb
from splitserve.evaluation.evaluate import EvalReport


def from_table(path: str) -> dict[str, list[lb.BucketResult]]:
    """Rows of `lb.format_table` ("| draft | bucket | prompts | mean prompt tokens | τ | rounds |
    exact |") back into results; per-position acceptance and token counts are not in the table."""
    named: dict[str, list[lb.BucketResult]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 7 or cells[0] in ("draft", "") or set(cells[0]) <= set("-"):
            continue
        name, label, prompts, mean, tau, rounds, exact = cells
        report = None
        if tau != "-":
            hit, _, total = exact.partition("/")
            report = EvalReport(tau=float(tau), per_position=[], rounds=int(rounds), tokens=0, num_prompts=int(prompts),
                                temperature=0.0, block_size=0, exact_matches=None if exact == "-" else int(hit))
            if total and int(total) != int(prompts):
                raise SystemExit(f"{path}: exact {exact} is not over the row's {prompts} prompts")
        named.setdefault(name, []).append(lb.BucketResult(label, int(prompts), 0.0 if mean == "-" else float(mean),
                                                          report))
    if not named:
        raise SystemExit(f"{path}: no table rows of the form lb.format_table writes")
    return named


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*", help="lengths.json files of `splitserve eval --length-buckets`")
    ap.add_argument("--from-table", help="a Markdown table of lb.format_table's form, instead of the files")
    ap.add_argument("--names", nargs="+", help="one label per file (default: the labels inside)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.names and len(args.names) != len(args.files):
        raise SystemExit(f"--names: {len(args.names)} labels for {len(args.files)} files")
    if bool(args.files) == bool(args.from_table):
        raise SystemExit("give lengths.json files or --from-table, one of the two")
    merged = from_table(args.from_table) if args.from_table else {}
    for i, path in enumerate(args.files):
        for name, results in lb.read(path).items():
            merged[args.names[i] if args.names else name] = results
    out = lb.write(merged, args.out)
    print(lb.format_table(merged))
    print(f"wrote {out}/lengths.md, lengths.json, lengths.png")


if __name__ == "__main__":
    main()
