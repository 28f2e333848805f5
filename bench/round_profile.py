"""Where a speculative round's time goes on the GPU, and how idle the GPU is inside it.

    python bench/round_profile.py --draft RUN_OR_EXPORT --prompts HELDOUT.jsonl --out profile.json \
        [--num-prompts 8] [--max-tokens 128] [--max-context 1024] [--min-window 256] [--compile] \
        [--markov-topk K] [--no-markov-kernel]

1. Component costs, each captured as its own CUDA graph and replayed back to back (CUDA events)
   at the first prompt's length and attention window: t_decode (the engine's AR step), t_draft
   (the draft's γ tokens), t_verify (the target on γ+1 tokens), t_round (the engine's whole
   round graph).
2. Real requests (greedy chat prompts, the engine's spec and AR modes): τ, TPOT, and the wall time
   per round on the host, so ideal speedup τ·t_decode/(t_draft + t_verify) can be set against the
   measured one.
3. A torch.profiler trace of one request in spec mode: the union of GPU activity (kernels,
   copies, memsets) over the decode window gives the GPU idle fraction; gaps between kernels are
   split into the gap at each round boundary (host read of the committed tokens, Python, the
   next graph launch) and gaps inside the graph, and the top kernels by total time are listed.

A target too large to carry (the 8B-class shape of the issue) runs with random weights instead:

    python bench/round_profile.py --random-shape llama-8b --project-tau 2.73 2.98 --out profile_8b.json \
        [--draft-layers 4] [--block-size 16] [--prompt-len 300] [--compile]

The draft is an untrained DSpark of the given depth and block (the default Markov head and
confidence head), the prompts are random tokens, and EOS is ignored. Step time and in-round idle
do not depend on the weights; acceptance does, so nothing is accepted and the speedup is a
projection: τ · (AR TPOT) / (wall time per round), for each τ measured with the trained draft
on the real target (--project-tau).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from functools import partial
from pathlib import Path

import torch
from roles_gpu import RANDOM_SHAPES, random_target, untrained_draft

from splitserve.config import EngineConfig, ModelsConfig
from splitserve.evaluation.bench import synthetic_prompts
from splitserve.evaluation.gpu_trace import long_gap_neighbours, union
from splitserve.loading import load_models
from splitserve.speculative.engine import Engine, SamplingParams
from splitserve.target.eos import eos_ids
from splitserve.target.graphs import StepGraphs
from splitserve.target.native.decoder import PRODUCTS


def time_graph(fn, iters: int, device: torch.device) -> float:
    """ms per replay of fn's CUDA graph, replayed back to back (off CUDA: eager calls, host clock)."""
    if device.type != "cuda":
        import time

        fn()
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        return 1000 * (time.perf_counter() - t) / iters
    graphs = StepGraphs(True, device)
    graphs.prepare("k", fn)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graphs.run("k", fn)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def component_costs(engine: Engine, prompt: list[int], iters: int) -> dict:
    """Each step at the prompt's committed length p and the attention window a request there
    uses; every replay first resets p (one tiny fill kernel), so all replays see the same p.
    With --compile the draft and verify components are compiled like the engine's steps."""
    e = engine
    P = len(prompt)
    e.check_fits(P, 1)
    w = e._window_for("spec", P)
    d_out = torch.zeros(e.gamma, dtype=torch.long, device=e.device)
    block = torch.zeros(e.gamma + 1, dtype=torch.long, device=e.device)
    v_out = torch.zeros(e.gamma + 1, dtype=torch.long, device=e.device)

    def draft_only():
        tok, _, _ = e._draft_block(0.0, w)  # as the round drafts (draft_attention included)
        d_out.copy_(tok)

    def verify_only():  # the target on [x_p, d_1..d_γ] at p..p+γ (writes cache slots the next round overwrites)
        logits, _ = e.target.forward_static(block[None], e.cache, e.seq_len + e._offsets, window=w, verify=True)
        v_out.copy_(logits[0].argmax(-1))

    def at_p(fn):
        def step():
            e.seq_len.fill_(P)
            fn()
        return step

    if e.cfg.compile_backend:
        draft_only, verify_only = (torch.compile(f, backend=e.cfg.compile_backend, dynamic=False)
                                   for f in (draft_only, verify_only))
    out = {"p": P, "window": w}
    steps = (("t_draft_ms", draft_only), ("t_verify_ms", verify_only), ("t_round_ms", e._step("spec", 0.0, w)),
             ("t_decode_ms", e._step("ar", 0.0, e._window_for("ar", P))))
    if e._recurrent:  # the rewind: replay of the accepted prefix through the recurrent mixers
        steps += tuple((f"t_commit_{keep}_ms", partial(e.target.commit_static, e.cache, keep))
                       for keep in (1, e.gamma + 1))
    for name, fn in steps:
        e._reset()
        e._prefill(prompt, 0.0)
        if name.startswith("t_commit"):
            e._step("spec", 0.0, w)()  # a verify forward first: the commit replays its inputs
        out[name] = time_graph(at_p(fn), iters, e.device)
    e._reset()
    return out


def requests(engine: Engine, prompts: list[list[int]], params: SamplingParams, mode: str) -> dict:
    stats = [engine.generate(p, params, mode=mode) for p in prompts]
    rounds = sum(max(len(s.tokens) - 1, 0) if mode == "ar" else len(s.accepts) for s in stats)
    decode_s = sum(s.total_s - s.ttft_s for s in stats)
    tpots = [s.tpot_s for s in stats if s.tpot_s is not None]
    out = {"requests": len(stats), "tokens": sum(len(s.tokens) for s in stats),
           "mean_tpot_ms": 1000 * statistics.fmean(tpots), "wall_per_step_ms": 1000 * decode_s / max(rounds, 1),
           "outputs": [s.tokens for s in stats]}
    if mode == "spec":
        out["tau"] = sum(n + 1 for s in stats for n in s.accepts) / max(rounds, 1)
    return out


def idle_profile(engine: Engine, prompt: list[int], params: SamplingParams) -> dict:
    """GPU activity of one spec request after its prefill (µs, from a chrome trace)."""
    from torch.profiler import ProfilerActivity, profile

    engine.generate(prompt, params, mode="spec")  # graphs captured, allocator warm
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        stats = engine.generate(prompt, params, mode="spec")
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/trace.json")
        trace = json.loads(Path(f"{tmp}/trace.json").read_text())["traceEvents"]
    gpu = [ev for ev in trace if ev.get("ph") == "X" and ev.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    launches = sorted(ev["ts"] for ev in trace if ev.get("ph") == "X" and ev.get("name") == "cudaGraphLaunch")
    if not gpu or not launches:
        return {"error": "no GPU activity or no graph launches in the trace"}
    t0 = launches[0]
    window = [(ev["ts"], ev["ts"] + ev["dur"]) for ev in gpu if ev["ts"] >= t0]
    busy = union(window)
    span = busy[-1][1] - t0
    busy_us = sum(b - a for a, b in busy)
    gaps = [(busy[i + 1][0] - busy[i][1], busy[i + 1][0]) for i in range(len(busy) - 1)]
    # The gap that ends at the first kernel after a graph launch is a round boundary.
    starts = {min((a for a, _ in busy if a >= t), default=None) for t in launches}
    boundary = [g for g, end in gaps if end in starts]
    inside = [g for g, end in gaps if end not in starts]
    long_inside = long_gap_neighbours([ev for ev in gpu if ev["ts"] >= t0], starts, threshold_us=5.0)
    kernels: dict[str, list[float]] = {}
    for ev in gpu:
        if ev["ts"] >= t0:
            kernels.setdefault(ev["name"], []).append(ev["dur"])
    top = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:15]
    rounds = len(stats.accepts)
    return {
        "rounds": rounds,
        "window_us": span,
        "gpu_busy_us": busy_us,
        "gpu_idle_fraction": 1 - busy_us / span,
        "boundary_gap_us_total": sum(boundary),
        "boundary_gap_us_median": statistics.median(boundary) if boundary else None,
        "inside_gap_us_total": sum(inside),
        "inside_gaps_over_5us": sum(g > 5 for g in inside),
        "inside_gaps_over_5us_by_neighbours": long_inside,
        "gpu_us_per_round": busy_us / max(rounds, 1),
        "kernels_per_round": sum(len(v) for v in kernels.values()) / max(rounds, 1),
        "top_kernels": [{"name": k[:120], "calls": len(v), "total_us": sum(v), "share": sum(v) / busy_us}
                        for k, v in top],
        # every kernel of the window, most launched first: where the round's launches come from
        "launches_per_round": {k[:120]: len(v) / max(rounds, 1)
                               for k, v in sorted(kernels.items(), key=lambda kv: -len(kv[1]))},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", help="a trained draft: run dir or export")
    ap.add_argument("--prompts", help="held-out chat prompts (JSONL), with --draft")
    ap.add_argument("--random-shape", choices=sorted(RANDOM_SHAPES),
                    help="instead of --draft: this target shape with random weights and an untrained draft")
    ap.add_argument("--draft-layers", type=int, default=4, help="with --random-shape")
    ap.add_argument("--block-size", type=int, default=16, help="with --random-shape: γ")
    ap.add_argument("--prompt-len", type=int, default=300, help="with --random-shape: random prompt tokens")
    ap.add_argument("--project-tau", type=float, nargs="*", default=[],
                    help="τ values measured elsewhere: project the speedup at this round cost")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-context", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--compile", action="store_true", help="EngineConfig.compile_backend='inductor'")
    ap.add_argument("--min-window", type=int, default=EngineConfig.min_window,
                    help="EngineConfig.min_window (0: attend to the whole cache every step)")
    ap.add_argument("--markov-topk", type=int, default=EngineConfig.markov_topk,
                    help="EngineConfig.markov_topk (0: the exact Markov stage)")
    ap.add_argument("--no-markov-kernel", dest="markov_kernel", action="store_false", default=EngineConfig.markov_kernel,
                    help="EngineConfig.markov_kernel=False: the exact Markov stage as the PyTorch loop (A/B)")
    ap.add_argument("--decoder", default=EngineConfig.decoder, choices=("auto", "native", "hf"),
                    help="EngineConfig.decoder: the target forward of the engine's steps")
    ap.add_argument("--weight-format", default=EngineConfig.weight_format, choices=("model", "fp8"),
                    help="EngineConfig.weight_format (fp8: weight-only FP8, native decoder, not lossless)")
    ap.add_argument("--native-products", default=EngineConfig.native_products, choices=PRODUCTS,
                    help="EngineConfig.native_products")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if (args.draft is None) == (args.random_shape is None):
        ap.error("give exactly one of --draft (a trained draft) and --random-shape")
    if args.draft is not None and args.prompts is None:
        ap.error("--draft needs --prompts")

    if args.random_shape:
        target = random_target(args.random_shape, args.device)
        draft = untrained_draft(target, args.draft_layers, args.block_size)
        prompts = synthetic_prompts(target.info.vocab_size, args.num_prompts, args.prompt_len, 0,
                                    {draft.arch.mask_token_id})
        params = SamplingParams(max_tokens=args.max_tokens)  # no EOS: every request runs max_tokens
    else:
        from splitserve.evaluation.heldout import load_prompt_ids

        target, draft = load_models(ModelsConfig(draft=args.draft, device=args.device))
        prompts = load_prompt_ids(args.prompts, target.tokenizer, args.num_prompts)
        params = SamplingParams(max_tokens=args.max_tokens, eos_ids=eos_ids(target))
    engine = Engine(target, draft, EngineConfig(max_context=args.max_context, min_window=args.min_window,
                                                markov_topk=args.markov_topk, markov_kernel=args.markov_kernel,
                                                decoder=args.decoder, weight_format=args.weight_format,
                                                native_products=args.native_products,
                                                compile_backend="inductor" if args.compile else None))
    on_gpu = engine.device.type == "cuda"
    res = {"device": torch.cuda.get_device_name() if on_gpu else "cpu", "torch": torch.__version__,
           "compile": args.compile, "min_window": args.min_window, "markov_topk": args.markov_topk,
           "markov_kernel": args.markov_kernel,
           "decoder": type(engine.target).__name__, "weight_format": args.weight_format,
           "native_products": args.native_products,
           "gamma": engine.gamma, "max_context": engine.max_context, "draft": args.draft or "untrained",
           "random_shape": args.random_shape, "draft_layers": draft.arch.num_layers, "dtype": str(target.dtype)}
    res.update(component_costs(engine, prompts[0], args.iters))
    for mode in ("spec", "ar"):  # warm-up request first: graph capture
        engine.generate(prompts[0], params, mode=mode)
    spec, ar = requests(engine, prompts, params, "spec"), requests(engine, prompts, params, "ar")
    res["exact"] = sum(a == b for a, b in zip(spec.pop("outputs"), ar.pop("outputs")))
    res["spec"], res["ar"] = spec, ar
    tau = spec["tau"]
    res["ideal_speedup"] = tau * res["t_decode_ms"] / (res["t_draft_ms"] + res["t_verify_ms"])
    res["graph_speedup"] = tau * res["t_decode_ms"] / res["t_round_ms"]  # the round graph as one unit
    res["measured_speedup"] = ar["mean_tpot_ms"] / spec["mean_tpot_ms"]
    res["measured_over_ideal"] = res["measured_speedup"] / res["ideal_speedup"]
    # Projections (not measurements): a draft with this τ at this round cost.
    res["projected"] = [{"tau": t, "speedup_over_ar": t * ar["mean_tpot_ms"] / spec["wall_per_step_ms"],
                         "spec_tpot_ms": spec["wall_per_step_ms"] / t} for t in args.project_tau]
    res["profile"] = idle_profile(engine, prompts[0], params) if on_gpu else None
    print(json.dumps({k: v for k, v in res.items() if k != "profile"}, indent=1))
    print(json.dumps(res["profile"], indent=1))
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
