"""`splitserve serve` (the OpenAI-compatible server) and `splitserve bench` (batch-1 latency)."""

from __future__ import annotations

import argparse
import sys

from splitserve.checks import draft_meta
from splitserve.cli.flags import Flags, new_parser


def _models_args(f: Flags) -> None:
    from splitserve.config import EngineConfig, ModelsConfig  # dataclasses only: cheap to import

    f.add(ModelsConfig, "draft", "--draft", required=True,
          help="exported draft directory (or a training run directory)")
    f.add(ModelsConfig, "target", "--target", help="target name or HF directory (default: the draft run's own)")
    f.add(ModelsConfig, "device", "--device", help="auto (CUDA when available) | cpu | cuda[:N]")
    f.add(ModelsConfig, "dtype", "--dtype", help="auto (bfloat16 on CUDA, float32 elsewhere) | float32 | bfloat16")
    f.hub()
    f.add(EngineConfig, "max_context", "--max-model-len", type=int, metavar="N",
          help="prompt + generated tokens per request, at most the target's max_position_embeddings")
    f.alias("max_context", "--max-context")
    f.add(EngineConfig, "use_cuda_graphs", "--no-cuda-graphs", action="store_false",
          help="run the round eagerly on CUDA too")
    f.add(EngineConfig, "verify_kernel", "--verify-kernel", choices=["auto", "torch"],
          help="auto: the fused Triton verification kernels where they run; torch: the PyTorch reference")
    f.add(EngineConfig, "compile_backend", "--compile", action="store_const", const="inductor",
          help="torch.compile the round and the AR step (inductor) before graph capture")
    f.add(EngineConfig, "verify_schedule", "--verify-schedule", choices=["static", "confidence"],
          help="confidence: verify only the prefix the draft's calibrated confidences pay for")
    f.add(EngineConfig, "min_window", "--min-window", type=int,
          help="attend to the first W cache slots only, W = min-window * 2^k covering the request "
               "(one CUDA graph per W); 0: the whole --max-model-len every step")
    f.add(EngineConfig, "markov_topk", "--markov-topk", type=int,
          help="greedy rounds: run the Markov stage over each position's K best backbone candidates "
               "(output unchanged, τ may drop); 0: the exact stage over the whole vocab")
    f.add(EngineConfig, "markov_kernel", "--no-markov-kernel", action="store_false",
          help="run the exact greedy Markov stage as the PyTorch loop instead of one Triton launch per "
               "draft position (for A/B measurement)")
    f.add(EngineConfig, "draft_attention", "--draft-attention", choices=["kernel", "sdpa"],
          help="the draft's attention over its context: kernel (split-KV over the cache in place) | sdpa "
               "(context concatenated with the block; for A/B measurement)")
    f.add(EngineConfig, "overlap_steps", "--no-overlap", action="store_const", const=False,
          help="wait for each round's tokens before queueing the next (for A/B measurement; the default "
               "queues the next round first on CUDA)")
    f.add(EngineConfig, "decoder", "--decoder", choices=["auto", "native", "hf"],
          help="the target forward of the engine: native (Llama/Mistral/Qwen2/Qwen3: fused kernels) | hf "
               "(transformers) | auto (native where it serves the target)")
    f.add(EngineConfig, "weight_format", "--weight-format", choices=["model", "fp8"],
          help="fp8: weight-only FP8 target products (native decoder; faster, NOT lossless against the model)")
    f.add(EngineConfig, "draft_weight_format", "--draft-weight-format", choices=["model", "fp8"],
          help="fp8: weight-only FP8 copies of the draft's products (fc, layers, lm_head); lossless: the "
               "target still decides every token, only acceptance may move")


def serve_parser() -> tuple[argparse.ArgumentParser, Flags]:
    from splitserve.config import EngineConfig, ServerConfig

    p = new_parser(prog="splitserve serve", description="OpenAI-compatible speculative server "
                                "(flags named as vLLM's where vLLM has one; docs/serving.md).")
    f = Flags(p)
    _models_args(f)
    f.add(ServerConfig, "host", "--host", help="address to listen on; 0.0.0.0 serves every interface")
    f.add(ServerConfig, "port", "--port", type=int, help="TCP port")
    f.add(ServerConfig, "served_model_name", "--served-model-name",
          help="model id in /v1/models and the only accepted 'model' (default: the target's name)")
    f.alias("served_model_name", "--model-name")
    f.add(ServerConfig, "api_key", "--api-key", help="require 'Authorization: Bearer KEY' on /v1/* (401 otherwise)")
    f.add(ServerConfig, "chat_template", "--chat-template", metavar="FILE",
          help="Jinja chat template file used instead of the tokenizer's")
    f.add(EngineConfig, "seed", "--seed", type=int, help="generator seed for sampled requests without a seed")
    f.add(ServerConfig, "max_queue", "--max-queue", type=int, help="waiting requests beyond this get 503")
    f.add(ServerConfig, "request_timeout_s", "--request-timeout", type=float, metavar="REQUEST_TIMEOUT",
          help="seconds for a request body to arrive (408 after)")
    f.add(ServerConfig, "keep_alive_s", "--timeout-keep-alive", type=float, metavar="TIMEOUT_KEEP_ALIVE",
          help="seconds an idle keep-alive connection stays open (uvicorn's name)")
    f.add(ServerConfig, "ignore_fields", "--ignore-field", action="append", convert=tuple, metavar="NAME",
          help="accept this request field and ignore it instead of refusing it with 400 (repeatable)")
    return p, f


def serve_main(argv: list[str]) -> None:
    p, f = serve_parser()
    args = p.parse_args(argv)
    from splitserve.config import EngineConfig, ModelsConfig, ServerConfig
    from splitserve.errors import UserError
    from splitserve.models.build import DraftMismatchError
    from splitserve.serve.app import run_server

    models, engine, server = (f.build(c, args) for c in (ModelsConfig, EngineConfig, ServerConfig))
    meta = draft_meta(models.draft, "--draft")
    try:
        run_server(models, engine, server, meta)
    except DraftMismatchError as exc:
        raise UserError(f"refusing to start: {exc}") from None


def bench_parser() -> tuple[argparse.ArgumentParser, Flags]:
    from splitserve.config import BenchConfig

    p = new_parser(prog="splitserve bench", description=(
        "Batch-1 latency and acceptance in sglang.bench_serving's shape: random prompts of exactly "
        "--input-len tokens (or chat prompts with --prompts), greedy, --output-len tokens each with EOS "
        "ignored, one request at a time. Reports accept length, acceptance by position, TTFT / TPOT / ITL "
        "(mean, median, p99), output tok/s, request throughput and duration; --baseline adds the engine's "
        "AR mode and the speedup over it (docs/serving.md)."))
    f = Flags(p)
    _models_args(f)
    f.add(BenchConfig, "random", "--random", action="store_true",
          help="the random dataset (what runs without --prompts): prompts of exactly --input-len token ids, "
               "drawn by --random-source from --seed; each body is decoded to text and re-encoded until the "
               "ids are the text's own tokenization (cut, or topped up with random ids, at most 10 round "
               "trips; a prompt that does not settle keeps its ids and is counted in the report), then the "
               "tokenizer's special tokens are added as a server adds them")
    f.add(BenchConfig, "random_source", "--random-source", metavar="SOURCE",
          help="uniform: random non-special ids | sequential: consecutive ids from a random offset (vllm bench "
               "serve's random, bench_serving's random-ids) | chitchat or a chat JSONL: first user turns "
               "repeated to --input-len (bench_serving's random, which repeats ShareGPT turns)")
    f.add(BenchConfig, "input_len", "--input-len", type=int, help="tokens per random prompt, special tokens included")
    f.add(BenchConfig, "output_len", "--output-len", type=int,
          help="tokens generated per request (random prompts: exactly, EOS ignored)")
    f.add(BenchConfig, "num_requests", "--num-requests", type=int, help="requests measured, one at a time")
    f.add(BenchConfig, "max_concurrency", "--max-concurrency", type=int,
          help="requests in flight; only 1 (the engine decodes one request at a time)")
    f.add(BenchConfig, "prompts", "--prompts",
          help="prompt rows (chat or pre-tokenized input_ids JSONL, or 'chitchat' for the held-out set) "
               "instead of random ones; "
               "replies stop at EOS or after --output-len tokens")
    f.add(BenchConfig, "warmup", "--warmup", type=int, help="requests run first and not measured (graph capture)")
    f.add(BenchConfig, "seed", "--seed", type=int, help="seed of the random prompts (default: 0)")
    f.add(BenchConfig, "baseline", "--baseline", action="store_true",
          help="also run the engine's AR mode (no draft) on the same prompts; the table adds the speedup")
    f.add(BenchConfig, "hf_baselines", "--hf-baselines", action="store_true",
          help="also transformers generate, and assisted generation with --assistant (slow at long lengths)")
    f.add(BenchConfig, "assistant", "--assistant", help="same-tokenizer small causal LM for assisted generation")
    f.add(BenchConfig, "result_file", "--result-file", metavar="FILE",
          help="write the report as JSON to FILE and the table as Markdown beside it (FILE with .md)")
    f.alias("result_file", "--json")
    return p, f


def bench_main(argv: list[str]) -> None:
    p, f = bench_parser()
    args = p.parse_args(argv)
    from splitserve.config import BenchConfig, EngineConfig, ModelsConfig
    from splitserve.evaluation.bench import run_bench
    from splitserve.models.build import DraftMismatchError

    models, engine, cfg = (f.build(c, args) for c in (ModelsConfig, EngineConfig, BenchConfig))
    meta = draft_meta(models.draft, "--draft")
    try:
        run_bench(models, engine, cfg, meta=meta)
    except DraftMismatchError as exc:
        sys.exit(f"splitserve bench: {exc}")
