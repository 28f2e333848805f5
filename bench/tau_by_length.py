"""Held-out τ per context-length bucket for several drafts in one table and one plot (issue 43
item 5: a draft trained at 2K against one trained at 8K or longer, on the same target).

Each draft is first measured by `splitserve eval --length-buckets ... --out DIR`; this merges
their lengths.json files:

    python bench/tau_by_length.py DIR_A/lengths.json DIR_B/lengths.json --names "trained at 2K" \
        "trained at 8K" --out docs/results/lengths_h200

-> OUT/lengths.md, OUT/lengths.json, OUT/lengths.png.
"""

from __future__ import annotations

import argparse

from splitserve.evaluation import length_buckets as lb


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+", help="lengths.json files of `splitserve eval --length-buckets`")
    ap.add_argument("--names", nargs="+", help="one label per file (default: the labels inside)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.names and len(args.names) != len(args.files):
        raise SystemExit(f"--names: {len(args.names)} labels for {len(args.files)} files")
    merged = {}
    for i, path in enumerate(args.files):
        for name, results in lb.read(path).items():
            merged[args.names[i] if args.names else name] = results
    out = lb.write(merged, args.out)
    print(lb.format_table(merged))
    print(f"wrote {out}/lengths.md, lengths.json, lengths.png")


if __name__ == "__main__":
    main()
