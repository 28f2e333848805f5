"""The batch-1 floor, in one run: the engine's AR step and speculative round beside the
transformers static-cache peer and the weight-read floor, for both target shapes.

    python bench/engine_floor_gpu.py --out floor.json [--shapes llama-8b smollm2] \
        [--variants native native-compiled native-fp8 hf-compiled] [--draft-layers 4] [--block-size 16] \
        [--prompt-len 300] [--new-tokens 128] [--iters 50] [--project-tau 3.0] [--no-peer] \
        [--draft-vocab 0 32000]

Per shape, random bf16 weights of the real shape (a step's time does not depend on the values):
  floor    the bytes one decode step must read (every layer's weights, the final norm, the
           lm_head, one embedding row) over the device-to-device copy bandwidth measured here
  peer     transformers `generate` with cache_implementation="static" (transformers compiles
           that forward itself), greedy, EOS ignored: TPOT = (t(1 + N) - t(1)) / N
  engine   per variant: t_decode, t_draft, t_verify and t_round, each its own CUDA graph replayed
           back to back (round_profile.component_costs); AR TPOT and wall time per round in real
           requests; kernels per round and GPU idle inside the decode window (a profiled request),
           also against the untraced wall time per round (the tracer's gaps left out: see
           bench/idle_untraced.py)
Variants name EngineConfig settings: hf | native, then any of -compiled (torch.compile, inductor),
-fp8 (weight-only FP8, not lossless), -cublas (native_products="cublas": cuBLAS products and separate
elementwise kernels, the native decoder before the fused products), -triton (native_products="triton":
the verify forward fused too), -nopdl (SPLITSERVE_PDL=0: no
programmatic dependent launch), -ipdl (torch._inductor.config.triton.enable_pdl: inductor's kernels use
PDL too; the setting TORCHINDUCTOR_ENABLE_PDL=1 gives at import), -sync (overlap_steps=False: the host
reads each round's tokens before it queues the next, the engine before it overlapped them), -sdpa
(draft_attention="sdpa": the draft concatenates its context with the block under a mask, through
SDPA, instead of reading its cache in place with the split-KV kernel), -dfp8 (draft_weight_format="fp8":
the draft's fc, layers and lm_head as weight-only FP8, lossless).
--draft-vocab runs every variant once per draft vocabulary (draft.draft_vocab_size; 0: the target's
whole vocabulary), keyed VARIANT@vocabN for N > 0: the round time a reduced head saves.
The draft is untrained, so nothing is accepted: any TPOT at a τ is a projection,
τ · (AR TPOT) / (wall time per round), labelled so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch._inductor.config
from idle_untraced import traced_us_per_round, untraced_idle
from roles_gpu import copy_bandwidth, random_target, untrained_draft
from round_profile import component_costs, idle_profile, requests

from splitserve.config import EngineConfig
from splitserve.evaluation.bench import synthetic_prompts
from splitserve.speculative.engine import Engine, SamplingParams
from splitserve.target.native import attention_kernel


FLAGS = ("compiled", "fp8", "dfp8", "cublas", "triton", "nopdl", "ipdl", "sync", "sdpa")


def variant_config(name: str, max_context: int) -> EngineConfig:
    base, *flags = name.split("-")
    if base not in ("hf", "native") or any(f not in FLAGS for f in flags):
        raise SystemExit(f"unknown variant {name!r}: hf|native followed by any of " + ", ".join(f"-{f}" for f in FLAGS))
    return EngineConfig(max_context=max_context, decoder=base, weight_format="fp8" if "fp8" in flags else "model",
                        native_products=next((f for f in ("cublas", "triton") if f in flags), "fused"),
                        compile_backend="inductor" if "compiled" in flags else None,
                        overlap_steps=False if "sync" in flags else None,
                        draft_attention="sdpa" if "sdpa" in flags else "kernel",
                        draft_weight_format="fp8" if "dfp8" in flags else "model")


@contextlib.contextmanager
def variant_env(name: str):
    """The environment a variant's engine is built, captured and timed in (inductor reads its
    environment once, at import, so -ipdl sets its config instead)."""
    flags = name.split("-")[1:]
    env = {"SPLITSERVE_PDL": "0" if "nopdl" in flags else "1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    ipdl = getattr(torch._inductor.config.triton, "enable_pdl", None)
    if ipdl is not None:
        torch._inductor.config.triton.enable_pdl = "ipdl" in flags
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if ipdl is not None:
            torch._inductor.config.triton.enable_pdl = ipdl


def step_bytes(target) -> int:
    """Bytes a decode step reads at least: every parameter once, but one row of the input
    embedding (tied embeddings: the lm_head reads the whole matrix anyway)."""
    model = target.model
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if embed.data_ptr() != head.data_ptr():
        total -= (embed.shape[0] - 1) * embed.shape[1] * embed.element_size()
    return total


def peer_tpot_ms(target, prompt: list[int], new_tokens: int, reps: int = 3) -> float:
    """transformers generate, static cache (compiled by transformers), greedy, EOS ignored."""
    model = target.model
    ids = torch.tensor([prompt], device=target.device)
    kw = dict(do_sample=False, cache_implementation="static", eos_token_id=None, pad_token_id=0,
              attention_mask=torch.ones_like(ids), temperature=None, top_p=None, top_k=None)

    def run(n: int) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    for _ in range(2):  # compilation, graph capture
        run(new_tokens + 1)
    long = statistics.median(run(new_tokens + 1) for _ in range(reps))
    short = statistics.median(run(1) for _ in range(reps))
    return 1000 * (long - short) / new_tokens


@torch.no_grad()  # as serving runs: a step compiled under grad mode would trace a backward
def engine_costs(target, draft, name: str, prompts, args) -> dict:
    cfg = variant_config(name, args.prompt_len + args.new_tokens + 64)
    t0 = time.time()
    engine = Engine(target, draft, cfg)
    params = SamplingParams(max_tokens=args.new_tokens)
    out = component_costs(engine, prompts[0], args.iters)
    for mode in ("spec", "ar"):
        engine.generate(prompts[0], params, mode=mode)  # graph capture (and compilation)
    spec, ar = requests(engine, prompts, params, "spec"), requests(engine, prompts, params, "ar")
    out["exact"] = sum(a == b for a, b in zip(spec.pop("outputs"), ar.pop("outputs")))
    out["spec"], out["ar"] = spec, ar
    prof = idle_profile(engine, prompts[0], params) if engine.device.type == "cuda" else {}
    out["kernels_per_round"] = prof.get("kernels_per_round")
    out["gpu_idle_fraction"] = prof.get("gpu_idle_fraction")
    # the tracer lengthens the replay, so the busy time is also set against the untraced wall
    # time per round (bench/idle_untraced.py)
    out["gpu_busy_us_per_round"] = busy = prof.get("gpu_us_per_round")
    out["traced_us_per_round"] = traced_us_per_round(prof) if "window_us" in prof else None
    out["idle_untraced"] = untraced_idle(busy, 1000 * spec["wall_per_step_ms"]) if busy else None
    out["top_kernels"] = prof.get("top_kernels", [])[:8]
    out["launches_per_round"] = prof.get("launches_per_round", {})
    out["decoder"] = type(engine.target).__name__
    out["setup_s"] = time.time() - t0
    out["projected"] = [{"tau": t, "spec_tpot_ms": spec["wall_per_step_ms"] / t,
                         "speedup_over_ar": t * ar["mean_tpot_ms"] / spec["wall_per_step_ms"]}
                        for t in args.project_tau]
    if "t_commit_1_ms" in out:  # recurrent target: a round is the graphed round plus one commit
        print(f"  {name}: rewind (commit replay) {out['t_commit_1_ms']:.3f} ms for 1 token, "
              f"{out[f't_commit_{engine.gamma + 1}_ms']:.3f} ms for {engine.gamma + 1}", flush=True)
    print(f"  {name}: decode {out['t_decode_ms']:.3f} ms, round {out['t_round_ms']:.3f} ms "
          f"(draft {out['t_draft_ms']:.3f}, verify {out['t_verify_ms']:.3f}), "
          f"{out['kernels_per_round'] or 0:.0f} kernels/round, idle {100 * (out['gpu_idle_fraction'] or 0):.1f}% traced, "
          f"{100 * (out['idle_untraced'] or 0):.1f}% against the untraced round",
          flush=True)
    return out


def table(shape: str, res: dict) -> str:
    floor, peer = res["floor_ms"], res.get("peer_tpot_ms")
    rows = [f"### {shape}: floor {floor:.3f} ms ({res['step_gb']:.2f} GB at {res['copy_gbps']:.0f} GB/s)"
            + (f", transformers static-cache peer {peer:.3f} ms" if peer else ""), "",
            "| variant | decode | round | draft | verify | round/decode | decode/floor | decode/peer | kernels/round "
            "| idle (traced) | idle (untraced round) | AR TPOT (requests) | round in requests | rewind 1 / γ+1 |",
            "|" + "---|" * 14]
    for name, v in res["variants"].items():
        rows.append(f"| {name} | {v['t_decode_ms']:.3f} | {v['t_round_ms']:.3f} | {v['t_draft_ms']:.3f} "
                    f"| {v['t_verify_ms']:.3f} | {v['t_round_ms'] / v['t_decode_ms']:.2f} "
                    f"| {v['t_decode_ms'] / floor:.2f} | {v['t_decode_ms'] / peer if peer else float('nan'):.2f} "
                    f"| {v['kernels_per_round'] or 0:.0f} | {100 * (v['gpu_idle_fraction'] or 0):.1f}% "
                    f"| {100 * (v.get('idle_untraced') or 0):.1f}% "
                    f"| {v['ar']['mean_tpot_ms']:.3f} | {v['spec']['wall_per_step_ms']:.3f} "
                    f"| {_rewind(v)} |")
    return "\n".join(rows)


def _rewind(v: dict) -> str:
    keys = sorted((k for k in v if k.startswith("t_commit_")), key=lambda k: int(k.split("_")[2]))
    return " / ".join(f"{v[k]:.3f}" for k in keys) or "-"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["llama-8b", "smollm2"])
    # hf-compiled last: at the 8B-class shape its compilation alone takes minutes
    ap.add_argument("--variants", nargs="+", default=["native-cublas", "native", "native-compiled", "native-fp8"])
    ap.add_argument("--draft-layers", type=int, default=4)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=300)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--project-tau", type=float, nargs="*", default=[])
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--draft-vocab", type=int, nargs="+", default=[0])
    # the attention kernel's split plan: programs per SM for every launch (default: the shipped rule,
    # two for decode rows, one for verify rows)
    ap.add_argument("--attention-programs-per-sm", type=int, default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.attention_programs_per_sm is not None:
        attention_kernel.PROGRAMS_PER_SM = attention_kernel.PROGRAMS_PER_SM_FULL_ROWS = args.attention_programs_per_sm
    for name in args.variants:
        variant_config(name, 1)
    bandwidth = copy_bandwidth()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "args": vars(args), "shapes": {}}
    for shape in args.shapes:
        print(f"[{shape}]", flush=True)
        target = random_target(shape)
        drafts = {n: untrained_draft(target, args.draft_layers, args.block_size, n) for n in args.draft_vocab}
        draft = drafts[args.draft_vocab[0]]
        prompts = synthetic_prompts(target.info.vocab_size, args.requests, args.prompt_len, 0,
                                    {draft.arch.mask_token_id})
        nbytes = step_bytes(target)
        res = {"step_gb": nbytes / 1e9, "copy_gbps": bandwidth, "floor_ms": 1000 * nbytes / (bandwidth * 1e9),
               "variants": {}}
        if not args.no_peer:
            res["peer_tpot_ms"] = peer_tpot_ms(target, prompts[0], args.new_tokens)
            print(f"  transformers static cache: {res['peer_tpot_ms']:.3f} ms/token", flush=True)
        for name, vocab in ((n, v) for v in args.draft_vocab for n in args.variants):
            key = f"{name}@vocab{vocab}" if vocab else name
            with variant_env(name):
                try:
                    res["variants"][key] = engine_costs(target, drafts[vocab], name, prompts, args)
                except Exception as e:  # keep the other variants' numbers
                    print(f"  {key}: FAILED {type(e).__name__}: {e}", flush=True)
                    res.setdefault("failed", {})[key] = f"{type(e).__name__}: {e}"[:1000]
                    continue
            Path(args.out).write_text(json.dumps(report | {"shapes": report["shapes"] | {shape: res}}, indent=1))
        report["shapes"][shape] = res
        print(table(shape, res), flush=True)
        del target, draft, drafts
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
