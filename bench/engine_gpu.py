"""Step costs of the batch-1 serving engine on a GPU: decode step, speculative round, and the
same for an 8B-class target shape with random weights.

    python bench/engine_gpu.py --out engine.json [--skip-smollm2] [--skip-large] [--random-smollm2] [--compile]
        [--input-len 1024] [--output-len 256] [--max-context C] [--min-window 256]

* SmolLM2-135M (the embedded target, bf16) with an *untrained* DSpark draft (γ=8, 1 layer): the
  engine's AR TPOT (one decode step, CUDA graph) and its speculative round time (draft round +
  verify of γ+1 tokens, one CUDA graph). An untrained draft accepts ~nothing, so its TPOT is
  the round time; the speedup a trained draft would give is τ · t_decode / t_round.
* An 8B-class shape (hidden 4096, 36 layers, 32/8 heads, FFN 12288, vocab 151936, random bf16
  weights; step time does not depend on the weights): the same two costs. Projections from a
  measured τ are labelled as projections in docs, not measured speedups.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from splitserve.config import EngineConfig


def _engine_costs(target, draft, args) -> dict:
    from splitserve.evaluation.bench import bench_engine, summarize, synthetic_prompts
    from splitserve.speculative.engine import Engine

    input_len, output_len = args.input_len, args.output_len
    engine = Engine(target, draft, EngineConfig(max_context=args.max_context or input_len + output_len + 64,
                                                use_cuda_graphs=True, compile_backend=args.compile,
                                                min_window=args.min_window))
    prompts = synthetic_prompts(target.info.vocab_size, args.requests, input_len, 0, {draft.arch.mask_token_id})
    out = {"cuda_graphs": engine.graphs.enabled, "gamma": engine.gamma, "max_context": engine.max_context,
           "windows": engine.windows}
    for mode in ("ar", "spec"):
        timings, _ = bench_engine(engine, prompts, output_len, mode, 1, f"engine {mode}")
        r = summarize(mode, timings)
        out[mode] = {"mean_tpot_ms": r.mean_tpot_ms, "median_tpot_ms": r.median_tpot_ms,
                     "mean_ttft_ms": r.mean_ttft_ms, "accept_length": r.mean_accept_length}
    tau = out["spec"]["accept_length"] or 1.0
    out["t_decode_ms"] = out["ar"]["median_tpot_ms"]
    out["t_round_ms"] = out["spec"]["median_tpot_ms"] * tau  # TPOT x tokens per round
    out["breakeven_tau"] = out["t_round_ms"] / out["t_decode_ms"]
    out["tau_for_2.5x"] = 2.5 * out["breakeven_tau"]
    return out


def smollm2(args) -> dict:
    """The embedded SmolLM2-135M, or (--random-smollm2) its shape with random weights, which needs
    no model files on the machine; step time does not depend on the weights."""
    from roles_gpu import random_target, untrained_draft

    from splitserve.config import TargetConfig
    from splitserve.target.hf import load_hf_target

    if args.random_smollm2:
        target = random_target("smollm2")
    else:
        target = load_hf_target(TargetConfig(dtype="bfloat16", device="cuda"))
    draft = untrained_draft(target, layers=1, gamma=8)
    return _engine_costs(target, draft, args)


def large(args) -> dict:
    from roles_gpu import random_target, untrained_draft

    t0 = time.time()
    target = random_target("llama-8b")
    draft = untrained_draft(target, layers=5, gamma=8)
    out = _engine_costs(target, draft, args)
    out["build_s"] = time.time() - t0
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-context", type=int, default=None, help="engine context (default: input+output+64)")
    ap.add_argument("--min-window", type=int, default=EngineConfig.min_window,
                    help="EngineConfig.min_window (0: the whole cache every step)")
    ap.add_argument("--skip-smollm2", action="store_true")
    ap.add_argument("--skip-large", action="store_true")
    ap.add_argument("--random-smollm2", action="store_true", help="SmolLM2's shape with random weights")
    ap.add_argument("--compile", action="store_const", const="inductor", default=None,
                    help="EngineConfig.compile_backend='inductor'")
    args = ap.parse_args()
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "input_len": args.input_len,
               "output_len": args.output_len, "requests": args.requests, "compile": args.compile,
               "min_window": args.min_window}
    for name, fn, skip in (("smollm2-135m", smollm2, args.skip_smollm2), ("llama-8b-shape", large, args.skip_large)):
        if skip:
            continue
        try:
            results[name] = fn(args)
        except Exception as exc:  # noqa: BLE001 - record and go on to the next shape
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(name, json.dumps(results[name], indent=1), flush=True)
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
