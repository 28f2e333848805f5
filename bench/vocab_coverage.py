"""How much of held-out text a reduced draft vocabulary can propose at all.

    python bench/vocab_coverage.py [--target smollm2-135m] [--data chitchat] [--heldout chitchat]
        [--sizes 1024 4096 8192 16384 32768] [--out DIR]

The draft vocabulary of N tokens is what training builds (models/vocab_map.py: the N most frequent
trained tokens of the training data). A token outside it can never be accepted, so the share of
held-out trained tokens inside it bounds the per-token acceptance a reduced draft can reach, and
1 - coverage is the most acceptance the reduction can cost per position (a draft whose whole-
vocabulary acceptance at a position is a keeps at least a - (1 - coverage) there). Counted on the
trained (assistant) tokens of the training conversations and of held-out conversations, as the
target's tokenizer and chat template tokenize them. CPU only, no model weights.
-> a Markdown table (and OUT/vocab_coverage.json, OUT/vocab_coverage.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from splitserve.data import LoadOptions, load_samples, resolve_train_path
from splitserve.evaluation.length_buckets import conversations_path
from splitserve.models.vocab_map import count_tokens, top_tokens


def tokenizer_for(target: str):
    from transformers import AutoTokenizer

    from splitserve.assets import resolve_target_path

    return AutoTokenizer.from_pretrained(resolve_target_path(target))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--data", default="chitchat", help="training conversations (the vocabulary is counted here)")
    ap.add_argument("--heldout", default="chitchat", help="held-out conversations (coverage is measured here)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 8192, 16384, 32768])
    ap.add_argument("--max-length", type=int, default=4096)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    tok = tokenizer_for(args.target)
    vocab = len(tok)
    train, _ = load_samples(resolve_train_path(args.data), tok, args.max_length, None, LoadOptions())
    held, _ = load_samples(conversations_path(args.heldout), tok, args.max_length, None, LoadOptions())
    counts = count_tokens(((s.input_ids, s.loss_mask) for s in train), vocab)  # (V,)
    held_counts = count_tokens(((s.input_ids, s.loss_mask) for s in held), vocab)  # (V,)
    rows = []
    for n in sorted(set(min(n, vocab) for n in args.sizes)):
        used = top_tokens(counts, n)
        rows.append({"draft_vocab": n, "share_of_vocab": n / vocab,
                     "train_coverage": float(counts[used].sum() / counts.sum()),
                     "heldout_coverage": float(held_counts[used].sum() / held_counts.sum())})
    result = {"target": args.target, "vocab_size": vocab, "train_conversations": len(train),
              "train_trained_tokens": int(counts.sum()), "distinct_trained_tokens": int((counts > 0).sum()),
              "heldout_conversations": len(held), "heldout_trained_tokens": int(held_counts.sum()), "rows": rows}
    md = [f"{args.target} (V = {vocab:,}): vocabulary counted on {result['train_trained_tokens']:,} trained tokens "
          f"of {len(train):,} conversations ({result['distinct_trained_tokens']:,} distinct), coverage measured on "
          f"{result['heldout_trained_tokens']:,} trained tokens of {len(held):,} held-out conversations.", "",
          "| draft vocabulary N | share of V | training tokens covered | held-out tokens covered |",
          "|---|---|---|---|"]
    md += [f"| {r['draft_vocab']:,} | {r['share_of_vocab']:.1%} | {r['train_coverage']:.2%} | {r['heldout_coverage']:.2%} |"
           for r in rows]
    print("\n".join(md))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "vocab_coverage.json").write_text(json.dumps(result, indent=1) + "\n")
        (out / "vocab_coverage.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
