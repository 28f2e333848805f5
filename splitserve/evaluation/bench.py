"""`splitserve bench`: batch-1 latency of the serving engine, in the public benchmark's shape.

`splitserve bench --random --input-len 8192 --output-len 1024 --num-requests 1000
--max-concurrency 1` is `sglang.bench_serving --dataset-name random --random-input-len 8192
--random-output-len 1024 --random-range-ratio 1.0 --max-concurrency 1` run in process: every
prompt exactly --input-len tokens (bench_dataset.py says how they are drawn), greedy, EOS ignored
so every request produces --output-len tokens, one request at a time. With --prompts, chat
prompts in the target's template whose greedy replies stop at EOS or after --output-len tokens
(the acceptance a trained draft earns lives on such prompts, not on random tokens). The metrics
(TTFT, TPOT, ITL, E2E, throughput, τ, acceptance by position) are defined in bench_report.py.
--baseline also runs the engine's autoregressive mode (same static cache, one token per step,
no draft) on the same prompts in the same process; --hf-baselines adds transformers `generate`
and, with --assistant, transformers assisted generation.
"""

from __future__ import annotations

import copy
import platform
import statistics
import time
from dataclasses import asdict

import torch
from tqdm import tqdm

from splitserve.config import BenchConfig, EngineConfig, ModelsConfig
from splitserve.errors import UserError
from splitserve.evaluation.bench_dataset import SEQUENTIAL, UNIFORM, random_prompts, synthetic_prompts  # noqa: F401
from splitserve.evaluation.bench_report import (  # noqa: F401  (MethodResult, percentile: tests and bench/)
    MethodResult,
    RequestTiming,
    format_table,
    itls,
    percentile,
    result_dict,
    summarize,
    write_results,
)
from splitserve.speculative.engine import Engine, SamplingParams
from splitserve.target.backend import DecodingTarget, require_decoding

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
        start = time.perf_counter()
        stats = engine.generate(ids, params, mode=mode)
        spec = mode == "spec"
        timings.append(RequestTiming(stats.ttft_s, stats.tpot_s, stats.total_s, len(stats.tokens),
                                     stats.accept_length if spec else None, len(stats.accepts) if spec else None,
                                     itl_s=itls(stats.token_times), accepts=list(stats.accepts) if spec else [],
                                     start_s=start, end_s=start + stats.total_s))
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
        return RequestTiming(t[0] if t else end - start, tpot, end - start, n, itl_s=itls(t), start_s=start,
                             end_s=end)

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


# ---- checks before any model work ---------------------------------------------------------


def check_config(cfg: BenchConfig) -> None:
    """One-line refusals of settings no run can honour."""
    if cfg.max_concurrency != 1:
        raise UserError(f"--max-concurrency {cfg.max_concurrency}: the engine decodes one request at a time "
                        f"(batch 1), so only --max-concurrency 1 is measured")
    if cfg.prompts is not None and (cfg.random or cfg.random_source != UNIFORM):
        flag = "--random" if cfg.random else f"--random-source {cfg.random_source}"
        raise UserError(f"{flag} and --prompts {cfg.prompts} name two datasets: give one")
    if cfg.random_source not in (UNIFORM, SEQUENTIAL):
        from splitserve.data import resolve_prompts_path
        from splitserve.data.rows import DataError

        try:
            resolve_prompts_path(cfg.random_source)  # a prompt set whose turns are repeated
        except DataError:
            raise UserError(f"--random-source {cfg.random_source}: neither {UNIFORM}, {SEQUENTIAL}, chitchat nor an "
                            f"existing prompt file") from None
    for flag, value in (("--input-len", cfg.input_len), ("--output-len", cfg.output_len),
                        ("--num-requests", cfg.num_requests)):
        if value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}")
    if cfg.warmup < 0:
        raise UserError(f"--warmup must be at least 0, got {cfg.warmup}")


def check_context(what: str, need: int, limit: int | None) -> None:
    """`need` tokens per request against the target's positions (None: no limit in its config)."""
    if limit and need > limit:
        raise UserError(f"{what} = {need} tokens per request, more than the target's context of {limit} tokens "
                        f"(max_position_embeddings)")


def _target_positions(models: ModelsConfig, meta) -> int | None:
    """The target's max_position_embeddings from its config.json alone."""
    from splitserve.loading import target_config_for
    from splitserve.target.arch import text_config
    from splitserve.target.hf import load_target_config

    config = load_target_config(target_config_for(meta, models))
    return getattr(text_config(config), "max_position_embeddings", None)


# ---- the command --------------------------------------------------------------------------


def _dataset(cfg: BenchConfig, target: DecodingTarget, draft) -> tuple[list[list[int]], frozenset[int], dict]:
    """-> (prompt ids, EOS ids that end a reply (empty: fixed-length requests), what they are)."""
    tokenizer = getattr(target, "tokenizer", None)
    if cfg.prompts is not None:
        from splitserve.evaluation.heldout import load_prompt_ids

        ids = load_prompt_ids(cfg.prompts, tokenizer, cfg.num_requests)
        longest = max(map(len, ids))
        check_context(f"the longest prompt of {cfg.prompts} ({longest} tokens) + --output-len {cfg.output_len}",
                      longest + cfg.output_len, target.max_positions)
        return ids, target.eos_ids(), {"name": "prompts", "path": cfg.prompts, "num_prompts": len(ids),
                                       "mean_input_len": statistics.fmean(map(len, ids))}  # EOS as the server
    mask = getattr(draft.arch, "mask_token_id", None) if draft is not None else None  # EAGLE-3 has none
    avoid = {mask} if mask is not None else set()
    rp = random_prompts(tokenizer, target.info.vocab_size, cfg.num_requests, cfg.input_len, cfg.seed,
                        cfg.random_source, avoid)
    return rp.ids, frozenset(), {"name": "random", "source": cfg.random_source, "input_len": cfg.input_len,
                                 "output_len": cfg.output_len, "seed": cfg.seed, "re_tokenized": tokenizer is not None,
                                 "special_tokens": rp.special_tokens, "unsettled": rp.unsettled}


def _transformers_rows(cfg: BenchConfig, target: DecodingTarget, prompts, eos, n_in: int) -> dict[str, MethodResult]:
    out = {"transformers generate": summarize("transformers generate", bench_hf_generate(
        target, prompts, cfg.output_len, cfg.warmup, "generate", eos_ids=eos), input_tokens=n_in)}
    name = "transformers assisted"
    if cfg.assistant is None:
        out[name] = MethodResult(name, note="no --assistant (a small causal LM with the target's tokenizer)")
        return out
    assistant, why = load_assistant(cfg.assistant, target)
    if assistant is None:
        out[name] = MethodResult(name, note=why)
    else:
        out[name] = summarize(name, bench_hf_generate(target, prompts, cfg.output_len, cfg.warmup, "assisted",
                                                      assistant=assistant, eos_ids=eos), input_tokens=n_in)
    return out


def run_bench(models: ModelsConfig, engine_cfg: EngineConfig, cfg: BenchConfig, target: DecodingTarget | None = None,
              draft=None, meta=None) -> dict:
    """Runs every method, prints the table, writes the result files when asked -> the report dict.
    `target` / `draft` may be passed in already loaded (tests); otherwise they are loaded
    (`meta`: the draft's DraftMeta when the caller has read it). Settings that cannot run, and
    random requests longer than the target's context, are refused before any weight is read."""
    from splitserve.loading import load_models, read_draft_meta

    check_config(cfg)
    random_need = ("--input-len {} + --output-len {}".format(cfg.input_len, cfg.output_len),
                   cfg.input_len + cfg.output_len)
    if target is None:
        meta = meta or read_draft_meta(models.draft)
        if cfg.prompts is None:
            check_context(*random_need, _target_positions(models, meta))
        target, draft = load_models(models, meta)
    require_decoding(target, "splitserve bench")
    if cfg.prompts is None:
        check_context(*random_need, target.max_positions)
    engine_cfg = copy.copy(engine_cfg)
    prompts, eos, dataset = _dataset(cfg, target, draft)
    engine_cfg.max_context = max(engine_cfg.max_context, max(map(len, prompts)) + cfg.output_len)
    engine = Engine(target, draft, engine_cfg)
    n_in = sum(map(len, prompts))

    if cfg.prompts is not None and cfg.warmup:
        # Chat prompts differ in length: prefill each once, untimed, so that the first method
        # timed does not alone pay for per-shape kernel setup (cuDNN attention plans, autotuning).
        for ids in prompts:
            engine.generate(ids, SamplingParams(max_tokens=1), mode="ar")
    results: dict[str, MethodResult] = {}
    spec_t, spec_out = bench_engine(engine, prompts, cfg.output_len, "spec", cfg.warmup, "engine spec", eos)
    results["engine spec"] = summarize("engine spec", spec_t, gamma=engine.gamma, input_tokens=n_in)
    if cfg.baseline:
        ar_t, ar_out = bench_engine(engine, prompts, cfg.output_len, "ar", cfg.warmup, "engine AR", eos)
        results["engine AR"] = summarize("engine AR", ar_t, input_tokens=n_in)
        results["engine spec"].exact_vs_ar = sum(a == b for a, b in zip(spec_out, ar_out))
    if cfg.hf_baselines:
        results.update(_transformers_rows(cfg, target, prompts, eos, n_in))

    shape = (f"{cfg.num_requests} random prompts ({cfg.random_source}) x {cfg.input_len} tokens in, "
             f"{cfg.output_len} out (EOS ignored)" if cfg.prompts is None else
             f"{len(prompts)} chat prompts from {cfg.prompts} (mean {dataset['mean_input_len']:.0f} tokens), "
             f"replies up to {cfg.output_len} tokens or EOS")
    heading = (f"batch 1 (max concurrency 1), {shape}, greedy, target {target.info.name}, γ={engine.gamma}, "
               f"{engine.device}")
    table = format_table(results)
    report = {
        "config": asdict(cfg),
        "engine": asdict(engine_cfg),
        "dataset": dataset,
        "target": target.info.name,
        "draft": models.draft,
        "block_size": engine.gamma,
        "device": str(engine.device),
        "dtype": str(target.dtype).removeprefix("torch."),
        "cuda_graphs": engine.graphs.enabled,
        "machine": platform.machine(),
        "torch": torch.__version__,
        "heading": heading,
        "results": {k: result_dict(v) for k, v in results.items()},
        "table": table,
    }
    print(f"\n{heading}\n\n{table}")
    if dataset.get("unsettled"):
        print(f"\n{dataset['unsettled']} random prompts' text does not re-encode to their ids exactly "
              f"(their ids were used)")
    if cfg.result_file:
        paths = write_results(report, cfg.result_file, heading)
        print(f"\nwrote {paths[0]} and {paths[1]}")
    return report
