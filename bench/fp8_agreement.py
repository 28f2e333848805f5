"""How often weight-only FP8 (EngineConfig.weight_format="fp8") changes a greedy reply of the
real embedded target, and what it does to AR TPOT.

    python bench/fp8_agreement.py --out fp8.json [--sets chitchat humaneval mtbench] [--num-prompts 16] \
        [--max-tokens 64] [--device cpu|cuda] [--dtype float32|bfloat16]

SmolLM2-135M-Instruct, the engine's AR mode (no draft), greedy, EOS respected: every prompt is
answered with the model's own weights and with FP8 copies of every layer product (one scale per
output row; the lm_head and embeddings stay in the model's dtype). Per prompt set: the share of
replies that are identical, and the mean number of tokens before the first difference. FP8 is
not lossless, so this is the price of its speed, not a check of correctness.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from splitserve.config import EngineConfig, TargetConfig
from splitserve.evaluation.heldout import load_prompt_ids
from splitserve.speculative.engine import Engine, SamplingParams
from splitserve.target.hf import load_hf_target


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def fake_quantised(target):
    """A copy of `target` whose layer products hold dequantise(quantize_fp8(w)) in the model's
    dtype: on a CPU, where the FP8 path is the PyTorch reference (target/native/linear.py), the
    same numbers as weight_format="fp8" up to float32 rounding, without re-dequantising per step."""
    import copy

    from splitserve.target.hf import HFTarget, decoder_layers
    from splitserve.target.native.linear import quantize_fp8
    from splitserve.target.native.support import PROJECTIONS

    model = copy.deepcopy(target.model)
    for module in model.modules():  # the copied capture hooks would write into the original target
        module._forward_hooks.clear()
    clone = HFTarget(model, target.info, target.tokenizer)
    with torch.no_grad():
        for layer in decoder_layers(clone.decoder, target.info.num_layers):
            for block, names in PROJECTIONS.items():
                for name in names:
                    w = getattr(getattr(layer, block), name).weight
                    w8, scale = quantize_fp8(w)
                    w.copy_((w8.float() * scale[:, None]).to(w.dtype))
    return clone


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", nargs="+", default=["chitchat", "humaneval", "mtbench"])
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    target = load_hf_target(TargetConfig(dtype=args.dtype, device=args.device))
    if target.device.type == "cuda":  # the FP8 kernel itself
        engines = {fmt: Engine(target, None, EngineConfig(max_context=2048, weight_format=fmt, decoder="native"))
                   for fmt in ("model", "fp8")}
    else:  # the reference would dequantise every weight at every step: quantise once instead
        engines = {"model": Engine(target, None, EngineConfig(max_context=2048, decoder="native")),
                   "fp8": Engine(fake_quantised(target), None, EngineConfig(max_context=2048, decoder="native"))}
    params = SamplingParams(max_tokens=args.max_tokens, eos_ids=target.eos_ids())
    report = {"target": target.info.name, "device": str(target.device), "dtype": args.dtype,
              "max_tokens": args.max_tokens, "sets": {}}
    for name in args.sets:
        prompts = [p for p in load_prompt_ids(name, target.tokenizer, args.num_prompts) if len(p) < 1900]
        replies = {fmt: [] for fmt in engines}
        tpot = {fmt: [] for fmt in engines}
        for i, prompt in enumerate(prompts):
            for fmt, engine in engines.items():
                stats = engine.generate(prompt, params, mode="ar")
                replies[fmt].append(stats.tokens)
                if stats.tpot_s is not None:
                    tpot[fmt].append(1000 * stats.tpot_s)
            print(f"[{name}] {i + 1}/{len(prompts)}: identical={replies['model'][-1] == replies['fp8'][-1]}",
                  flush=True)
        same = [a == b for a, b in zip(replies["model"], replies["fp8"])]
        prefix = [common_prefix(a, b) for a, b in zip(replies["model"], replies["fp8"])]
        report["sets"][name] = {
            "prompts": len(prompts), "identical": sum(same), "identical_share": sum(same) / len(same),
            "mean_prefix_tokens": statistics.fmean(prefix),
            "mean_reply_tokens": statistics.fmean(len(r) for r in replies["model"]),
            "median_tpot_ms": {fmt: statistics.median(v) if v else None for fmt, v in tpot.items()},
        }
    rows = ["| set | prompts | identical replies | mean tokens before the first difference | mean reply tokens |",
            "|---|---|---|---|---|"]
    for name, r in report["sets"].items():
        rows.append(f"| {name} | {r['prompts']} | {r['identical']} ({100 * r['identical_share']:.0f}%) "
                    f"| {r['mean_prefix_tokens']:.1f} | {r['mean_reply_tokens']:.1f} |")
    how = "the FP8 kernel" if target.device.type == "cuda" else "weights quantised to FP8 and back"
    report["fp8_path"] = how
    print(f"FP8 ({how}) against the model's own weights ({args.dtype}, {target.device}), greedy, "
          f"{args.max_tokens} tokens")
    print("\n".join(rows))
    Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
