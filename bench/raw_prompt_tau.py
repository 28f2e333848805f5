"""τ of drafts on bench_serving-style "random" prompts (a held-out user turn repeated to a length,
no chat template: the target continues the text) next to the same prompts' chat form.

    python bench/raw_prompt_tau.py RUN [RUN ...] --prompts FILE [--num-prompts 6] [--input-len 200]
        [--new-tokens 48] [--device cpu] [--dtype float32]

Each draft is served greedy by the engine on the same prompts: `--num-prompts` repeated-turn
prompts of `--input-len` tokens built as `splitserve bench --random --random-source FILE` builds
them, then the first `--num-prompts` prompts of FILE rendered with the chat template. It prints
τ (committed tokens over rounds, pooled) and first-position acceptance per draft and kind, as a
Markdown table. docs/results/public_shape_h100.md uses it to compare a draft trained on replies
only with one trained on every token (data.loss_on=all).
"""

from __future__ import annotations

import argparse

from splitserve.config import EngineConfig, ModelsConfig
from splitserve.data import ChatTemplate, encode_prompt, read_prompts
from splitserve.evaluation.bench_dataset import random_prompts
from splitserve.loading import load_models
from splitserve.speculative.engine import Engine, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--prompts", required=True, help="a held-out prompt file (never trained on)")
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--input-len", type=int, default=200)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()

    print("| draft | prompts | τ | a1 | rounds |\n|---|---|---|---|---|")
    for run in args.runs:
        target, draft = load_models(ModelsConfig(draft=run, device=args.device, dtype=args.dtype))
        raw = random_prompts(target.tokenizer, target.info.vocab_size, args.num_prompts, args.input_len, 0,
                             args.prompts, {draft.arch.mask_token_id}).ids
        chat = [encode_prompt(target.tokenizer, p, ChatTemplate()) for p in read_prompts(args.prompts)][: args.num_prompts]
        longest = max(len(p) for p in raw + chat)
        engine = Engine(target, draft, EngineConfig(max_context=longest + args.new_tokens + 1))
        for kind, prompts in ((f"repeated turn, {args.input_len} tokens", raw), ("chat template", chat)):
            accepts = [a for p in prompts for a in engine.generate(p, SamplingParams(max_tokens=args.new_tokens)).accepts]
            tau = sum(a + 1 for a in accepts) / len(accepts)
            a1 = sum(a > 0 for a in accepts) / len(accepts)
            print(f"| {run} | {kind} | {tau:.3f} | {a1:.2f} | {len(accepts)} |", flush=True)


if __name__ == "__main__":
    main()
