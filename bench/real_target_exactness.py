"""The serving engine against the target's own greedy decoding, on a real target, past its
sliding window.

    python bench/real_target_exactness.py --target gemma3-270m --prompts humaneval \
        --num-prompts 2 --new-tokens 420 --out FILE

Gemma-3-270M interleaves sliding-window layers (512 tokens) with full ones, so a prompt of
~150 tokens plus 420 new ones crosses the window in every request. Per prompt, three decodes in
float32 on the CPU, each greedy:
  reference  the target's own loop with its dynamic cache (speculative/decode.target_decode)
  ar         the serving engine's AR step (static cache, windowed masks)
  spec       the serving engine's speculative round with an untrained 1-layer draft: nearly every
             draft token is rejected, so every round writes γ+1 cache slots and masks γ of them
A difference is reported with the position and the target's top-2 logit gap there (a near tie
would be float rounding, not a bug).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from splitserve.config import DraftConfig, EngineConfig, TargetConfig
from splitserve.evaluation.heldout import load_prompt_ids
from splitserve.models.build import build_draft, resolve_arch
from splitserve.speculative.decode import target_decode
from splitserve.speculative.engine import Engine, SamplingParams
from splitserve.target.arch import attention_layout
from splitserve.target.hf import load_hf_target


def top2_gap(target, ids: list[int]) -> float:
    """The target's top-1 minus top-2 logit after `ids` (float32)."""
    with torch.no_grad():
        logits = target.model(torch.tensor([ids])).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def compare(target, prompt: list[int], ref: list[int], got: list[int]) -> dict:
    first = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
    if first is None and len(ref) == len(got):
        return {"equal": True}
    at = first if first is not None else min(len(ref), len(got))
    return {"equal": False, "first_difference": at, "position": len(prompt) + at,
            "top2_gap_there": top2_gap(target, prompt + ref[:at])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument("--prompts", default="humaneval")
    ap.add_argument("--num-prompts", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=420)
    ap.add_argument("--gamma", type=int, default=8)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    torch.manual_seed(0)
    target = load_hf_target(TargetConfig(name=Path(args.target).name, path=args.target, device="cpu"))
    windows = list(attention_layout(target.config).windows)  # per layer: its window or None
    arch = resolve_arch(DraftConfig(num_layers=1, block_size=args.gamma), target.info, target.config,
                        target.tokenizer)
    draft = build_draft(arch, target).eval()
    engine = Engine(target, draft, EngineConfig(max_context=4096))
    rows = []
    for i, prompt in enumerate(load_prompt_ids(args.prompts, target.tokenizer, args.num_prompts)):
        t0 = time.time()
        ref = target_decode(target, prompt, args.new_tokens)
        t1 = time.time()
        params = SamplingParams(max_tokens=args.new_tokens)
        ar = engine.generate(prompt, params, mode="ar").tokens
        t2 = time.time()
        spec = engine.generate(prompt, params, mode="spec")
        t3 = time.time()
        row = {"prompt": i, "prompt_tokens": len(prompt), "last_position": len(prompt) + args.new_tokens - 1,
               "ar": compare(target, prompt, ref, ar), "spec": compare(target, prompt, ref, spec.tokens),
               "spec_tau": spec.accept_length,
               "seconds": {"reference": round(t1 - t0, 1), "ar": round(t2 - t1, 1), "spec": round(t3 - t2, 1)}}
        print(json.dumps(row), flush=True)
        rows.append(row)
    result = {"target": target.info.name, "prompts": args.prompts, "new_tokens": args.new_tokens,
              "gamma": args.gamma, "dtype": "float32", "device": "cpu", "layer_windows": windows,
              "all_equal": all(r["ar"]["equal"] and r["spec"]["equal"] for r in rows), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{sum(r['spec']['equal'] for r in rows)}/{len(rows)} spec equal, "
          f"{sum(r['ar']['equal'] for r in rows)}/{len(rows)} ar equal")


if __name__ == "__main__":
    main()
