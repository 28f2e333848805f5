"""`splitserve bench`: batch-1 latency of the serving engine.

Random-token prompts of --input-len tokens, --output-len tokens each (EOS ignored, greedy),
--num-requests requests one after another; or, with --prompts, chat prompts in the target's
template whose greedy replies stop at EOS or after --output-len tokens (the acceptance a trained
draft earns lives on such prompts, not on random tokens). Per request: TTFT (start -> first token on the host)
and TPOT (the remaining tokens' mean interval, TTFT excluded); over requests: mean / median /
p99 and output tokens per second of wall time. With --baseline the same process also runs the
engine's autoregressive mode (same static cache, one token per step), transformers `generate`,
and transformers assisted generation when --assistant names a same-tokenizer small model.
"""

from __future__ import annotations

import copy
import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from splitserve.config import BenchConfig, EngineConfig, ModelsConfig
from splitserve.speculative.engine import Engine, SamplingParams
from splitserve.target.backend import DecodingTarget, require_decoding


@dataclass
class RequestTiming:
    ttft_s: float
    tpot_s: float | None
    latency_s: float
    output_tokens: int
    accept_length: float | None = None  # this request's τ
    rounds: int | None = None  # speculative rounds after the prefill


@dataclass
class MethodResult:
    name: str
    num_requests: int = 0
    mean_tpot_ms: float | None = None
    median_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    output_tok_s: float | None = None
    # τ, speculative methods: committed tokens over rounds, pooled over all requests (as in
    # `splitserve eval`; a mean of per-request τ would overweight short replies)
    mean_accept_length: float | None = None
    exact_vs_ar: int | None = None  # requests whose tokens equal the engine's AR output
    note: str | None = None  # why a method was skipped
    requests: list[RequestTiming] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(name: str, timings: list[RequestTiming]) -> MethodResult:
    ms = 1000.0
    tpots = [t.tpot_s * ms for t in timings if t.tpot_s is not None]
    ttfts = [t.ttft_s * ms for t in timings]
    res = MethodResult(name, num_requests=len(timings), requests=timings)
    if tpots:
        res.mean_tpot_ms, res.median_tpot_ms = statistics.fmean(tpots), statistics.median(tpots)
        res.p99_tpot_ms = percentile(tpots, 99)
    if ttfts:
        res.mean_ttft_ms, res.median_ttft_ms = statistics.fmean(ttfts), statistics.median(ttfts)
        res.p99_ttft_ms = percentile(ttfts, 99)
    wall = sum(t.latency_s for t in timings)
    res.output_tok_s = sum(t.output_tokens for t in timings) / wall if wall > 0 else None
    spec = [t for t in timings if t.accept_length is not None and t.rounds]
    if spec:
        res.mean_accept_length = sum(t.accept_length * t.rounds for t in spec) / sum(t.rounds for t in spec)
    return res


def synthetic_prompts(vocab_size: int, num: int, length: int, seed: int, avoid: set[int]) -> list[list[int]]:
    """Uniform random token ids, special tokens excluded (they would change the target's mode)."""
    allowed = torch.tensor([i for i in range(vocab_size) if i not in avoid])
    g = torch.Generator().manual_seed(seed)
    return [allowed[torch.randint(len(allowed), (length,), generator=g)].tolist() for _ in range(num)]


# ---- methods ------------------------------------------------------------------------------


def bench_engine(engine: Engine, prompts: list[list[int]], output_len: int, mode: str, warmup: int,
                 desc: str, eos_ids: frozenset[int] = frozenset()) -> tuple[list[RequestTiming], list[list[int]]]:
    params = SamplingParams(max_tokens=output_len, temperature=0.0, eos_ids=eos_ids)  # empty: fixed length
    if warmup:
        # every attention window's graph (and compiled step) now: a request that is the first to
        # reach a window would otherwise time its capture (seconds under --compile)
        engine.warmup(mode, 0.0)
    for _ in range(warmup):
        engine.generate(prompts[0], params, mode=mode)
    timings, outputs = [], []
    for ids in tqdm(prompts, desc=desc, unit="req", leave=False):
        stats = engine.generate(ids, params, mode=mode)
        timings.append(RequestTiming(stats.ttft_s, stats.tpot_s, stats.total_s, len(stats.tokens),
                                     stats.accept_length if mode == "spec" else None,
                                     len(stats.accepts) if mode == "spec" else None))
        outputs.append(stats.tokens)
    return timings, outputs


class _TokenClock:
    """A transformers streamer that only timestamps tokens (the first put is the prompt)."""

    def __init__(self):
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times += [time.perf_counter()] * int(value.numel())

    def end(self) -> None:
        pass


@torch.no_grad()
def bench_hf_generate(target: DecodingTarget, prompts: list[list[int]], output_len: int, warmup: int, desc: str,
                      assistant=None, eos_ids: frozenset[int] = frozenset()) -> list[RequestTiming]:
    """The target's own `generate` (transformers), greedy; without eos_ids EOS is disabled, so
    every request has output_len tokens."""

    def one(ids):
        clock = _TokenClock()
        inp = torch.tensor([ids], device=target.device)
        start = time.perf_counter()
        out = target.generate(inp, output_len, eos_ids, streamer=clock, assistant=assistant)
        end = time.perf_counter()
        n = out.shape[1] - inp.shape[1]
        t = [x - start for x in clock.times]
        tpot = (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None
        return RequestTiming(t[0] if t else end - start, tpot, end - start, n)

    for _ in range(warmup):
        one(prompts[0])
    return [one(ids) for ids in tqdm(prompts, desc=desc, unit="req", leave=False)]


def load_assistant(path: str, target: DecodingTarget):
    """-> (model, None) or (None, why it does not apply)."""
    from transformers import AutoConfig

    from splitserve.target.hf import load_causal_lm

    cfg = AutoConfig.from_pretrained(path)
    vocab = getattr(cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg, "vocab_size", None)
    if vocab != target.info.vocab_size:
        return None, f"assistant {path} has vocab {vocab}, target {target.info.vocab_size}: needs the same tokenizer"
    model = load_causal_lm(path, target.dtype, target.device)
    return model, None


# ---- the command --------------------------------------------------------------------------


def format_table(results: dict[str, MethodResult]) -> str:
    def f(x, fmt=".2f"):
        return "-" if x is None else format(x, fmt)

    ar = results.get("engine AR")
    head = ("| method | requests | mean TPOT ms | median TPOT ms | p99 TPOT ms | mean TTFT ms | output tok/s "
            "| τ | exact vs AR | speedup vs AR |")
    rows = [head, "|" + "---|" * 10]
    for r in results.values():
        if r.note:
            rows.append(f"| {r.name} | - | - | - | - | - | - | - | - | skipped: {r.note} |")
            continue
        speed = r.output_tok_s / ar.output_tok_s if ar and ar.output_tok_s and r.output_tok_s else None
        exact = "-" if r.exact_vs_ar is None else f"{r.exact_vs_ar}/{r.num_requests}"
        rows.append(f"| {r.name} | {r.num_requests} | {f(r.mean_tpot_ms)} | {f(r.median_tpot_ms)} | "
                    f"{f(r.p99_tpot_ms)} | {f(r.mean_ttft_ms)} | {f(r.output_tok_s, '.1f')} | "
                    f"{f(r.mean_accept_length, '.3f')} | {exact} | {f(speed, '.2f')} |")
    return "\n".join(rows)


def _prompts(cfg: BenchConfig, target: DecodingTarget, draft) -> tuple[list[list[int]], frozenset[int]]:
    """-> (prompt token ids, EOS ids that end a reply; empty for fixed-length synthetic requests)."""
    if cfg.prompts is not None:
        from splitserve.evaluation.heldout import load_prompt_ids

        return load_prompt_ids(cfg.prompts, target.tokenizer, cfg.num_requests), target.eos_ids()  # as the server
    avoid = set(getattr(target.tokenizer, "all_special_ids", None) or []) | {draft.arch.mask_token_id}
    return synthetic_prompts(target.info.vocab_size, cfg.num_requests, cfg.input_len, cfg.seed, avoid), frozenset()


def run_bench(models: ModelsConfig, engine_cfg: EngineConfig, cfg: BenchConfig, target: DecodingTarget | None = None,
              draft=None, meta=None) -> dict:
    """Runs every method, prints the table, writes JSON when asked -> the report dict.
    `target` / `draft` may be passed in already loaded (tests); otherwise they are loaded
    (`meta`: the draft's DraftMeta when the caller has read it)."""
    from splitserve.loading import load_models

    if cfg.input_len < 1 or cfg.output_len < 1 or cfg.num_requests < 1:
        raise ValueError("input_len, output_len and num_requests must be >= 1")
    if target is None:
        target, draft = load_models(models, meta)
    require_decoding(target, "splitserve bench")
    engine_cfg = copy.copy(engine_cfg)
    prompts, eos = _prompts(cfg, target, draft)
    engine_cfg.max_context = max(engine_cfg.max_context, max(map(len, prompts)) + cfg.output_len)
    engine = Engine(target, draft, engine_cfg)
    for ids in prompts:
        engine.check_fits(len(ids), cfg.output_len)  # the target's position limit

    if cfg.prompts is not None and cfg.warmup:
        # Chat prompts differ in length: prefill each once, untimed, so that the first method
        # timed does not alone pay for per-shape kernel setup (cuDNN attention plans, autotuning).
        for ids in prompts:
            engine.generate(ids, SamplingParams(max_tokens=1), mode="ar")
    results: dict[str, MethodResult] = {}
    spec_t, spec_out = bench_engine(engine, prompts, cfg.output_len, "spec", cfg.warmup, "engine spec", eos)
    results["engine spec"] = summarize("engine spec", spec_t)
    if cfg.baseline:
        ar_t, ar_out = bench_engine(engine, prompts, cfg.output_len, "ar", cfg.warmup, "engine AR", eos)
        results["engine AR"] = summarize("engine AR", ar_t)
        results["engine spec"].exact_vs_ar = sum(a == b for a, b in zip(spec_out, ar_out))
        results["transformers generate"] = summarize(
            "transformers generate",
            bench_hf_generate(target, prompts, cfg.output_len, cfg.warmup, "generate", eos_ids=eos))
        name = "transformers assisted"
        if cfg.assistant is None:
            results[name] = MethodResult(name, note="no --assistant (a small causal LM with the target's tokenizer)")
        else:
            assistant, why = load_assistant(cfg.assistant, target)
            if assistant is None:
                results[name] = MethodResult(name, note=why)
            else:
                results[name] = summarize(name, bench_hf_generate(target, prompts, cfg.output_len, cfg.warmup,
                                                                  "assisted", assistant=assistant, eos_ids=eos))

    report = {
        "config": asdict(cfg),
        "engine": asdict(engine_cfg),
        "target": target.info.name,
        "draft": models.draft,
        "block_size": engine.gamma,
        "device": str(engine.device),
        "dtype": str(target.dtype).removeprefix("torch."),
        "cuda_graphs": engine.graphs.enabled,
        "machine": platform.machine(),
        "torch": torch.__version__,
        "results": {k: asdict(v) for k, v in results.items()},
    }
    table = format_table(results)
    shape = (f"{cfg.num_requests} requests x {cfg.input_len} in / {cfg.output_len} out" if cfg.prompts is None else
             f"{len(prompts)} chat prompts from {cfg.prompts} (mean {statistics.fmean(map(len, prompts)):.0f} tokens), "
             f"replies up to {cfg.output_len} tokens or EOS")
    print(f"\nbatch 1, {shape}, greedy, target {target.info.name}, γ={engine.gamma}, {engine.device}\n\n{table}")
    report["table"] = table
    if cfg.json_out:
        Path(cfg.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.json_out).write_text(json.dumps(report, indent=1))
    return report
