"""Typed configs for serving and benchmarking; defaults live here, the CLI overrides a few."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelsConfig:
    """Which target and draft to load, and where."""

    draft: str  # exported draft directory (or a training run directory)
    target: str | None = None  # HF directory or "smollm2-135m"; None: the draft run's own target
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (bfloat16 on CUDA, float32 elsewhere) | float32 | bfloat16 | float16
    revision: str | None = None  # target.revision: a hub target's branch, tag or commit
    trust_remote_code: bool = False  # target.trust_remote_code: run the target's own modelling code


@dataclass
class EngineConfig:
    """The batch-1 engine: one static target KV cache and one static draft context."""

    max_context: int = 4096  # prompt + generated tokens of one request (capped by the target's positions)
    use_cuda_graphs: bool = True  # capture the draft+verify round and the AR step; CUDA only, ignored elsewhere
    verify_kernel: str = "auto"  # auto: Triton on CUDA when installed | torch: the reference
    seed: int = 0  # generator seed for T>0 requests that bring no seed of their own
    # static: verify the whole block (the default) | confidence: verify only the prefix d_1..d_L
    # chosen from the draft's calibrated prefix survivals (spec/schedule.py; lossless either way)
    verify_schedule: str = "static"
    # relative cost of verifying k+1 tokens, k = 0..γ (γ+1 values; time target forwards of each
    # width on the serving device to fill it); None: the linear model 1 + verify_cost_beta * k
    verify_cost: list[float] | None = None
    verify_cost_beta: float = 0.05
    # torch.compile the round and the AR step (before CUDA-graph capture), so that elementwise
    # chains (norms, RoPE, residuals, the Markov stage) fuse into fewer kernels. "inductor" for
    # real use; "aot_eager" traces without generating code (tests). None: off.
    compile_backend: str | None = None
    # Attention windows: a step attends to the first W cache slots only, W the smallest of
    # min_window, 2*min_window, ... (capped at the capacity) that holds every position the step
    # writes. One CUDA graph per window in use, so a short request does not pay for attention
    # over the whole max_context. 0: always the whole cache (one graph). On an H200 it cut a
    # γ=16 round of SmolLM2-135M from 3.04 to 2.02 ms compiled at context 1,024, and made the
    # round's cost independent of max_context (docs/results/engine_h200.md).
    min_window: int = 256
    # K > 0: greedy rounds run the Markov stage over each position's K best backbone candidates
    # (models/candidate_chain.py), a few launches instead of 3 per draft position. Output is the
    # target's greedy output either way, but a trained head often promotes tokens the backbone
    # ranks far lower: on an H200 with a trained γ=16 draft, K=256 saved 0.18 ms of a 2.2 ms
    # round and lost 11% of τ (K=64: 17%), a net loss (docs/results/engine_h200.md). 0: exact.
    markov_topk: int = 0
    # Keep each round's confidences c_1..c_γ in GenStats.confidences (STS calibration data for
    # held-out evaluation): one more small device copy and host read per round. Off for serving.
    record_confidence: bool = False


@dataclass
class ServerConfig:
    """The OpenAI-compatible HTTP front end (flag names as vLLM's where vLLM has one)."""

    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None  # the id in /v1/models; None: the target's name
    api_key: str | None = None  # when set, /v1/* needs "Authorization: Bearer <key>" (401 otherwise)
    chat_template: str | None = None  # a Jinja file replacing the tokenizer's chat template
    max_queue: int = 64  # waiting requests beyond this get 503
    max_body_bytes: int = 4 << 20  # larger bodies get 413
    request_timeout_s: float = 30.0  # a body not complete by then gets 408 (a client that stalls)
    keep_alive_s: float = 5.0  # an idle keep-alive connection is closed after this
    ignore_fields: tuple[str, ...] = ()  # request fields to drop instead of refusing them with 400


@dataclass
class BenchConfig:
    """`splitserve bench`: batch 1, greedy. Synthetic random-token prompts of `input_len` tokens
    with a fixed output length (EOS ignored), or, with `prompts`, chat prompts rendered with the
    target's template that stop at EOS or after `output_len` tokens."""

    input_len: int = 128
    output_len: int = 128
    prompts: str | None = None  # chat prompt JSONL (or "chitchat": the held-out set); None: synthetic
    num_requests: int = 10
    warmup: int = 1  # untimed requests first (CUDA graph capture, allocator, caches)
    seed: int = 0
    baseline: bool = False  # also: engine AR mode, transformers generate, assisted generation
    assistant: str | None = None  # small same-tokenizer causal LM for transformers assisted generation
    json_out: str | None = None
