"""Why greedy speculative output can differ from the target's greedy output in bf16.

    python bench/low_precision_divergence.py --draft RUN_OR_EXPORT --prompts HELDOUT.jsonl \
        [--dtype bfloat16] [--device cpu|cuda] [--num-prompts 20] [--max-tokens 96] [--out FILE]

The engine decodes each prompt twice, in its AR mode (one token per target forward) and its
speculative mode (γ+1 tokens per target forward). In exact arithmetic both are the target's
greedy output; in bf16 a forward over γ+1 tokens rounds differently from a forward over one, so a
near-tie between the two best tokens can resolve differently. For every prompt whose outputs
differ, this takes the common prefix up to the first difference and scores it once in float32:
if the AR token and the speculative token are the float32 top two with a margin below bf16's
resolution, the divergence is rounding, not a verification bug.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from splitserve.config import EngineConfig, ModelsConfig
from splitserve.evaluation.heldout import load_prompt_ids
from splitserve.loading import load_models
from splitserve.speculative.engine import Engine, SamplingParams
from splitserve.target.eos import eos_ids


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--num-prompts", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    target, draft = load_models(ModelsConfig(draft=args.draft, device=args.device, dtype=args.dtype))
    engine = Engine(target, draft, EngineConfig(max_context=1024))
    params = SamplingParams(max_tokens=args.max_tokens, eos_ids=eos_ids(target))
    prompts = load_prompt_ids(args.prompts, target.tokenizer, args.num_prompts)
    model32 = None
    rows = []
    for i, ids in enumerate(prompts):
        ar = engine.generate(ids, params, mode="ar").tokens
        spec = engine.generate(ids, params, mode="spec").tokens
        if ar == spec:
            rows.append({"prompt": i, "exact": True})
            continue
        j = next((k for k, (a, b) in enumerate(zip(ar, spec)) if a != b), min(len(ar), len(spec)))
        if model32 is None:  # the same weights, scored in float32
            model32 = type(target.model)(target.model.config).to(args.device)
            model32.load_state_dict({k: v.float() for k, v in target.model.state_dict().items()})
            model32.eval()
        with torch.no_grad():
            seq = torch.tensor([ids + ar[:j]], device=args.device)
            logits = model32(seq).logits[0, -1].float()  # (V,)
        top2 = logits.topk(2)
        a, b = (ar[j], spec[j]) if j < min(len(ar), len(spec)) else (None, None)
        row = {"prompt": i, "exact": False, "first_difference": j, "ar_token": a, "spec_token": b,
               "fp32_top2": top2.indices.tolist(), "fp32_margin": float(top2.values[0] - top2.values[1]),
               "fp32_logit_ar": float(logits[a]) if a is not None else None,
               "fp32_logit_spec": float(logits[b]) if b is not None else None}
        rows.append(row)
        print(json.dumps(row), flush=True)
    exact = sum(r["exact"] for r in rows)
    ties = [r for r in rows if not r["exact"] and r["ar_token"] is not None
            and set(r["fp32_top2"]) == {r["ar_token"], r["spec_token"]}]
    summary = {"prompts": len(rows), "exact": exact, "differ": len(rows) - exact,
               "differ_at_fp32_top2_pair": len(ties),
               "max_fp32_margin_of_those": max((r["fp32_margin"] for r in ties), default=None),
               "dtype": args.dtype, "device": args.device, "rows": rows}
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
