"""τ of drafts on bench_serving-style "random" prompts (a held-out user turn repeated to a length,
no chat template: the target continues the text) next to the same prompts' chat form.

    python bench/raw_prompt_tau.py RUN [RUN ...] --prompts FILE [--num-prompts 6] [--input-len 200]
        [--new-tokens 48] [--device cpu] [--dtype float32] [--first-tokens]

Each draft is served greedy by the engine on the same prompts: `--num-prompts` repeated-turn
prompts of `--input-len` tokens built as `splitserve bench --random --random-source FILE` builds
them, then the first `--num-prompts` prompts of FILE rendered with the chat template. It prints
τ (committed tokens over rounds, pooled) and first-position acceptance per draft and kind, as a
Markdown table. docs/results/public_shape_h100.md uses it to compare a draft trained on replies
only with one trained on every token (data.loss_on=all).

`--first-tokens` also shows, for the first repeated-turn prompt, what each draft proposes first
(served round, bench/capture_paths.first_tokens) at every third position of the target's own
greedy continuation, next to the token the target wrote there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from splitserve.config import EngineConfig, ModelsConfig
from splitserve.data import ChatTemplate, encode_prompt, read_prompts
from splitserve.evaluation.bench_dataset import random_prompts
from splitserve.loading import load_models
from splitserve.speculative.decode import target_decode
from splitserve.speculative.engine import Engine, SamplingParams

sys.path.insert(0, str(Path(__file__).parent))
from capture_paths import first_tokens  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--prompts", required=True, help="a held-out prompt file (never trained on)")
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--input-len", type=int, default=200)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--first-tokens", action="store_true")
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
        if args.first_tokens:
            show_first_tokens(target, draft, raw[0], args.new_tokens)


def show_first_tokens(target, draft, prompt: list[int], new_tokens: int) -> None:
    """The draft's first proposed token against the target's own next token, every third anchor."""
    full = prompt + target_decode(target, prompt, new_tokens)
    ids = torch.tensor([full], device=target.device)
    with torch.no_grad():
        aux = target.capture(ids).aux
    anchors = list(range(len(prompt), len(full) - draft.arch.block_size - 1, 3))
    _, served = first_tokens(draft, ids, aux, anchors)
    truth = [full[p + 1] for p in anchors]
    right = sum(a == b for a, b in zip(served, truth))
    words = lambda ts: " ".join(repr(target.tokenizer.decode([t])) for t in ts)  # noqa: E731
    print(f"first tokens at {len(anchors)} anchors: {right} right\n  target: {words(truth)}\n  draft:  {words(served)}",
          flush=True)


if __name__ == "__main__":
    main()
