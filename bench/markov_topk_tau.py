"""Does drafting over the top-K candidates (EngineConfig.markov_topk) cost acceptance?

    python bench/markov_topk_tau.py --draft RUN_OR_EXPORT --prompts HELDOUT.jsonl --out topk.json \
        [--topk 0 16 64] [--num-prompts 79] [--max-tokens 128]

For each K the serving engine (CUDA graphs, no compile) decodes the same held-out chat prompts
greedily. It reports pooled τ, and how many requests gave the same output as the first K listed:
all of them should, up to bf16 near-ties, since greedy verification commits the target's own
tokens whatever the draft proposes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from splitserve.config import EngineConfig, ModelsConfig
from splitserve.loading import load_models
from splitserve.speculative.engine import Engine, SamplingParams
from splitserve.target.eos import eos_ids


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--topk", type=int, nargs="+", default=[0, 16, 64])
    ap.add_argument("--num-prompts", type=int, default=79)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-context", type=int, default=1024)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from splitserve.evaluation.heldout import load_prompt_ids

    target, draft = load_models(ModelsConfig(draft=args.draft, device=args.device))
    prompts = load_prompt_ids(args.prompts, target.tokenizer, args.num_prompts)
    params = SamplingParams(max_tokens=args.max_tokens, eos_ids=eos_ids(target))
    rows, outputs = [], {}
    for k in args.topk:
        engine = Engine(target, draft, EngineConfig(max_context=args.max_context, markov_topk=k))
        engine.generate(prompts[0], params)  # graph capture
        start = time.perf_counter()
        stats = [engine.generate(p, params) for p in prompts]
        wall = time.perf_counter() - start
        rounds = sum(len(s.accepts) for s in stats)
        outputs[k] = [s.tokens for s in stats]
        row = {"markov_topk": k, "tau": sum(n + 1 for s in stats for n in s.accepts) / max(rounds, 1),
               "rounds": rounds, "tokens": sum(len(s.tokens) for s in stats), "wall_s": wall,
               "same_output_as_first": sum(a == b for a, b in zip(outputs[k], outputs[args.topk[0]]))}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| markov_topk | τ (pooled) | rounds | same output as K=%d |" % args.topk[0])
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['markov_topk']} | {r['tau']:.3f} | {r['rounds']} | {r['same_output_as_first']}/{len(prompts)} |")
    Path(args.out).write_text(json.dumps({"draft": args.draft, "num_prompts": len(prompts), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
