"""The lighter draft heads in the engine on the GPU: a reduced draft vocabulary and FP8 draft
weights, each eager and compiled, with grad mode on and off around graph capture.

    python bench/head_options_gpu.py [--shape smollm2] [--draft-vocab 8192] [--out FILE.json]

For each (draft vocabulary, draft weights, compile, grad mode at capture) below it builds the engine
over one random-weight target of the shape, captures its graphs (engine.warmup, as `splitserve
serve` and `splitserve bench` do), then reports whether every step was captured, whether greedy
spec output equals the engine's AR output, and the draft's time per round
(round_profile.component_costs, under no_grad). It answers "does this head run graphed, and what
does it cost", not acceptance (the draft is untrained).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import traceback
from pathlib import Path

import torch
from roles_gpu import random_target, untrained_draft
from round_profile import component_costs

from splitserve.config import EngineConfig
from splitserve.speculative.engine import Engine, SamplingParams


def one(target, draft, weights: str, compile_backend: str | None, grad: bool, prompt: list[int]) -> dict:
    cfg = EngineConfig(max_context=len(prompt) + 128, decoder="native", compile_backend=compile_backend,
                       draft_weight_format=weights)
    out: dict = {}
    try:
        engine = Engine(target, draft, cfg)
        with contextlib.nullcontext() if grad else torch.no_grad():
            engine.warmup("spec", 0.0)
            engine.warmup("ar", 0.0)
        out["graphs"] = engine.graphs.enabled
        out["failed"] = engine.graphs.failed
        params = SamplingParams(max_tokens=64)
        spec = engine.generate(prompt, params)
        ar = engine.generate(prompt, params, mode="ar")
        out["exact"] = spec.tokens == ar.tokens
        with torch.no_grad():
            costs = component_costs(engine, prompt, 30)
        out |= {k: round(v, 4) for k, v in costs.items() if k.startswith("t_")}
        out["graphs_after"] = engine.graphs.enabled
    except Exception as exc:  # keep the other combinations' answers
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:400]
        out["where"] = traceback.format_exc().splitlines()[-6:]
    torch.cuda.synchronize()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="smollm2")
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--prompt-len", type=int, default=300)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    target = random_target(args.shape)
    prompt = torch.randint(100, 1000, (args.prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    n = args.draft_vocab
    # (draft vocabulary, draft weights, compile backend, grad mode at capture): the whole head first,
    # the combinations expected to fail last (a failed capture can leave the device unusable)
    combos = [(0, "model", "inductor", False), (n, "model", "none", False), (n, "model", "inductor", False),
              (0, "fp8", "inductor", False), (n, "fp8", "inductor", False), (n, "model", "inductor", True),
              (0, "fp8", "inductor", True)]
    results = []
    for vocab, weights, backend, grad in combos:
        draft = untrained_draft(target, 4, 16, vocab)
        r = one(target, draft, weights, None if backend == "none" else backend, grad, prompt)
        key = dict(vocab=vocab, weights=weights, compile=backend, grad_at_capture=grad)
        print(json.dumps(key | r), flush=True)
        results.append(key | r)
        del draft
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
