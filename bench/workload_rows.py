"""Training rows for a benchmark workload: the target's own greedy continuations of prompts drawn
the way `splitserve bench --random` draws them, written as pre-tokenized rows.

    python bench/workload_rows.py --out rows.jsonl --num 300 --min-len 500 --max-len 7000 \
        --continuation 256 [--source uniform [PROMPTS.jsonl ...]] [--seed 1] [--device cuda] [--dtype bfloat16] \
        [--keep-prompt N]

A draft trained on chat replies has never seen what a target does after thousands of random token
ids (most often it falls into repeating a short phrase; with sglang-style prompts, a user turn
repeated to the length, it copies the turn on), so it accepts nothing there
(docs/results/public_shape_h100.md). These rows are that behaviour: each is a prompt of a random
length in [--min-len, --max-len], from the sources in turn (the bench's `uniform`, or a prompt file
whose turns are repeated, as `--random-source`), followed by --continuation tokens the target
generates greedily with EOS ignored, in the serving engine's AR mode. The loss mask covers the
continuation only. The ids go into the file as they are ({"input_ids", "loss_mask"} rows,
docs/data.md), since random ids do not survive a decode and re-encode. Seeds start at --seed, so
with the bench's --seed 0 kept apart, no benchmark prompt is among them. `--keep-prompt N` writes
only the last N prompt tokens before each continuation (generated from the whole prompt), which
makes rows short enough to train on a CPU. It costs acceptance: the target's hidden states of a
cut row come from the tail alone, which serving never shows the draft (τ 1.31 against 1.83 from
whole rows on the CPU; `draft.context_window` bounds the draft's context without that cost,
docs/results/public_shape_h100.md).
"""

from __future__ import annotations

import argparse
import json
import random
import time

from splitserve.config import EngineConfig, TargetConfig
from splitserve.evaluation.bench_dataset import random_prompts
from splitserve.speculative.engine import Engine, SamplingParams
from splitserve.target import load_target


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--num", type=int, default=300)
    ap.add_argument("--min-len", type=int, default=500)
    ap.add_argument("--max-len", type=int, default=7000)
    ap.add_argument("--continuation", type=int, default=256)
    ap.add_argument("--source", nargs="+", default=["uniform"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--keep-prompt", type=int, default=None)
    args = ap.parse_args()

    target = load_target(TargetConfig(device=args.device, dtype=args.dtype))
    engine = Engine(target, None, EngineConfig(max_context=args.max_len + args.continuation))
    lengths = random.Random(args.seed).choices(range(args.min_len, args.max_len + 1), k=args.num)
    # Each source's prompts drawn at once at the longest length (a prompt file is read once), then
    # each cut to its row's length: a prefix of random ids is random ids, of a repeated turn a repeated turn.
    sources = [args.source[i % len(args.source)] for i in range(args.num)]
    drawn = {s: iter(random_prompts(target.tokenizer, target.info.vocab_size, sources.count(s), args.max_len,
                                    args.seed + k, s).ids) for k, s in enumerate(dict.fromkeys(sources))}
    params = SamplingParams(max_tokens=args.continuation)  # greedy, EOS ignored
    start, distinct = time.perf_counter(), 0  # distinct: tokens per continuation, summed (how repetitive)
    with open(args.out, "w") as f:
        for i, (n, source) in enumerate(zip(lengths, sources)):
            ids = next(drawn[source])[:n]
            out = engine.generate(ids, params, mode="ar").tokens
            if args.keep_prompt is not None:
                ids = ids[len(ids) - min(args.keep_prompt, len(ids)):]
            f.write(json.dumps({"input_ids": ids + out, "loss_mask": [0] * len(ids) + [1] * len(out)}) + "\n")
            distinct += len(set(out))
            if (i + 1) % 25 == 0 or i + 1 == len(lengths):
                rate = (i + 1) / (time.perf_counter() - start)
                print(f"[workload_rows] {i + 1}/{len(lengths)} rows, {rate:.1f} rows/s", flush=True)
    print(f"[workload_rows] done: {len(lengths)} rows -> {args.out} ({time.perf_counter() - start:.0f} s); "
          f"{distinct / max(len(lengths), 1):.1f} distinct tokens per {args.continuation}-token continuation on average")


if __name__ == "__main__":
    main()
