"""The settings of every command besides train and dump: serve and bench, eval, export,
calibrate, report, gen. `cli/` builds each command's flags from these fields, so a default is
written once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from splitserve.config.run import TrainConfig

# --- serving and benchmarking (splitserve serve | bench) ---


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
    # chosen from the draft's calibrated prefix survivals (speculative/schedule.py; lossless either way)
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
    # over the whole max_context. 0: always the whole cache (one graph). It makes a round's cost
    # independent of max_context (measured in docs/results/engine_h200.md).
    min_window: int = 256
    # K > 0: greedy rounds run the Markov stage over each position's K best backbone candidates
    # (models/candidate_chain.py), a few launches instead of 3 per draft position. Output is the
    # target's greedy output either way, but a trained head often promotes tokens the backbone
    # ranks far lower, so with a trained draft the τ lost outweighed the time saved
    # (docs/results/engine_h200.md). 0: exact.
    markov_topk: int = 0
    # The exact greedy stage of a vanilla Markov head as one Triton launch per draft position
    # (models/markov_step_kernel.py) instead of 3-4. False: the PyTorch loop, kept for A/B
    # measurement (same tokens but at near ties of one ulp; output is the target's either way).
    markov_kernel: bool = True
    # The draft's attention over its context in a round: kernel (the block's K/V written into the
    # context cache, then the split-KV attention kernel the target's verify uses, reading the cache
    # in place; its PyTorch reference off CUDA) | sdpa (the context concatenated with the block
    # and masked, through SDPA; for A/B measurement). Same values either way, to rounding.
    draft_attention: str = "kernel"
    # Keep each round's confidences c_1..c_γ in GenStats.confidences (STS calibration data for
    # held-out evaluation): one more small device copy and host read per round. Off for serving.
    record_confidence: bool = False
    # The target forward of the engine's static steps: native (target/native/, the Llama family:
    # packed q|k|v and gate|up products, attention over the cache for a few queries) | hf (the
    # transformers forward) | auto (native where it serves the target, else hf). Lossless either way.
    decoder: str = "auto"
    # model: the target's own weights | fp8: weight-only FP8 copies of every layer product (native
    # decoder only), half the bytes read per step and NOT lossless against the model's own dtype
    weight_format: str = "model"
    # model: the draft's own weights | fp8: weight-only FP8 copies of the draft's products (fc, its
    # layers, the lm_head; speculative/draft_weights.py). Lossless either way: the draft only proposes.
    draft_weight_format: str = "model"
    # The native decoder's layers: fused (a decode step's products in the Triton weight product with
    # the norms, SiLU·up and residual adds folded in, launched with PDL on Hopper; verify and
    # prefill on cuBLAS) | triton (every forward of up to 32 tokens fused) | cublas (cuBLAS products
    # and separate elementwise kernels). Same values every way; bench/engine_floor_gpu.py compares them
    native_products: str = "fused"
    # Queue each round (AR step) before the host has read the one running, so the GPU does not
    # wait for Python between them (speculative/host_reads.py). None: on CUDA, where launches are
    # asynchronous; a CPU would only run a wasted step per request. Same tokens either way.
    overlap_steps: bool | None = None


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
    """`splitserve bench`: batch 1, greedy. The random dataset (prompts of exactly `input_len`
    token ids, `output_len` tokens each, EOS ignored: bench_serving's `--dataset-name random`
    shape), or, with `prompts`, chat prompts rendered with the target's template that stop at
    EOS or after `output_len` tokens."""

    input_len: int = 128
    output_len: int = 128
    random: bool = False  # name the random dataset (what runs without `prompts` anyway)
    random_source: str = "uniform"  # uniform | sequential | a prompt set whose user turns are repeated
    prompts: str | None = None  # chat prompt JSONL (or "chitchat": the held-out set); None: random
    num_requests: int = 10
    max_concurrency: int = 1  # requests in flight: the engine serves one at a time, so only 1
    warmup: int = 1  # untimed requests first (CUDA graph capture, allocator, caches)
    seed: int = 0
    baseline: bool = False  # also the engine's AR mode on the same prompts
    hf_baselines: bool = False  # also transformers generate and assisted generation
    assistant: str | None = None  # small same-tokenizer causal LM for transformers assisted generation
    result_file: str | None = None  # the report as JSON, its table as Markdown beside it


# --- the other commands (splitserve eval | export | calibrate | report | gen) ---


@dataclass
class EvalCommand:
    """`splitserve eval`: τ of a draft by speculative decoding (the draft and target: ModelsConfig)."""

    prompts: str = "chitchat"  # chat JSONL ({messages} or {prompt} lines), or "chitchat"
    num_prompts: int | None = None  # None: every prompt of the file
    max_new_tokens: int = 64
    temperature: float = 0.0
    seed: int = 0
    dtype: str = "float32"  # the target's and draft's (ModelsConfig.dtype): τ is measured in float32
    compare_untrained: bool = False  # also evaluate a freshly initialised draft
    json: bool = False  # print the full report as JSON
    chat_template: str | None = None  # a Jinja file replacing the target's chat template
    chat_template_kwargs: dict[str, Any] | None = None  # handed to the chat template
    # τ per prompt-length bucket (evaluation/length_buckets.py): the buckets' upper edges, prompts
    # cut from whole conversations (`prompts`: "chitchat" reads its held-out conversations).
    length_buckets: list[int] | None = None
    per_bucket: int = 8  # prompts per bucket
    out_dir: str | None = None  # length buckets: write lengths.json / .md / .png here


@dataclass
class ExportCommand:
    """`splitserve export RUN_DIR OUT_DIR` (the target: ModelsConfig.target, read on the CPU)."""

    run_dir: str
    out_dir: str
    format: str = "hf"  # hf | speculators (vLLM) | sglang (docs/deploy.md)
    algorithm: str | None = None  # sglang only: dspark (the default); dflash is refused
    keep_fp32: bool = False  # speculators only: keep float32 weights (default: bfloat16)
    force: bool = False  # replace OUT_DIR if it exists and is not empty


@dataclass
class CalibrateCommand:
    """`splitserve calibrate RUN_DIR`; None: the run's own setting (its config.yaml), else the
    EvalConfig default."""

    run_dir: str
    prompts: str | None = None  # None: the run's data.heldout_prompts
    num_prompts: int | None = None  # None: the run's eval.num_prompts
    max_new_tokens: int | None = None  # None: the run's eval.max_new_tokens
    temperatures: list[float] | None = None  # None: the run's eval.temperature
    bins: int | None = None  # ECE bins; None: the run's eval.calibration_bins


@dataclass
class ReportCommand:
    """`splitserve report SWEEP_DIR`: report.md and PNG plots over a sweep's runs."""

    sweep_dir: str
    wandb: bool = False  # also log the table and plots to wandb (offline by default)
    wandb_project: str = TrainConfig.wandb_project


@dataclass
class GenConfig:
    """`splitserve gen` (data/gen.py); the fields in `settings()` are recorded in every row."""

    data: str = "chitchat"  # "chitchat" (the embedded default) or a chat JSONL path
    out: str = "gen.jsonl"
    target: str = "smollm2-135m"  # the embedded default or a HF model directory
    target_name: str | None = None  # default: "smollm2-135m" or the directory's name
    max_new_tokens: int = 256  # per reply
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0  # sampling only; 1: off
    top_k: int = 0  # sampling only; 0: off
    seed: int = 0
    batch_size: int = 8  # conversations in flight (continuous) or per batch (static)
    batching: str = "continuous"  # continuous: a finished conversation frees its slot | static: whole-batch turns
    max_rows: int | None = None  # read only the first N input rows
    max_turns: int | None = None  # replies per conversation
    max_length: int = 1024  # no reply to a prompt of this many tokens or more (data.max_length)
    device: str = "auto"
    dtype: str = "float32"
    # A Jinja file replacing the target tokenizer's chat template (in-process only: a server renders
    # with the template it was started with).
    chat_template: str | None = None
    # Handed to the chat template in-process and sent with every request through servers,
    # e.g. {"enable_thinking": False}.
    chat_template_kwargs: dict[str, Any] | None = None

    def settings(self) -> dict[str, Any]:
        """Everything that decides a row's content; a resumed run must match it."""
        name = self.target_name or Path(self.target).name
        keys = ("data", "dtype", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "max_turns",
                "max_length", "chat_template")
        # None when unset, as in rows written before the key existed, so those still resume.
        return {"target": name, "target_path": self.target, **{k: getattr(self, k) for k in keys},
                "chat_template_kwargs": self.chat_template_kwargs or None}

    def check(self) -> None:
        if self.batch_size < 1 or self.max_new_tokens < 1 or self.max_length < 1:
            raise ValueError("batch_size, max_new_tokens and max_length must be positive")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError("need temperature >= 0, 0 < top_p <= 1 and top_k >= 0")
        if self.batching not in ("continuous", "static"):
            raise ValueError(f"batching must be continuous or static, got {self.batching!r}")


@dataclass
class EndpointConfig:
    """`splitserve gen --endpoint`: the OpenAI-compatible servers (data/endpoint.py)."""

    urls: list[str]  # server roots ("http://host:30000"); a trailing /v1 is accepted
    concurrency: int = 32  # requests in flight per endpoint
    timeout_s: float = 600.0  # per request, connection to last byte
    retries: int = 5  # after the first attempt
    backoff_s: float = 1.0  # before the first retry; doubles, capped at 60 s
    api_key: str | None = None

    def check(self) -> None:
        if not self.urls:
            raise ValueError("at least one --endpoint is needed")
        if self.concurrency < 1 or self.timeout_s <= 0 or self.retries < 0 or self.backoff_s < 0:
            raise ValueError("need concurrency >= 1, timeout > 0, retries >= 0 and backoff >= 0")


@dataclass
class RemoteOptions:
    """What only the endpoint path of `splitserve gen` has, beside the shared GenConfig."""

    endpoint: EndpointConfig
    num_samples: int = 1  # sampled replies per conversation, each its own row
    # Sent with every request, e.g. {"enable_thinking": false}; None: GenConfig.chat_template_kwargs.
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning: str = "keep"  # keep | drop the server's reasoning_content

    def template_kwargs(self, cfg: GenConfig) -> dict[str, Any] | None:
        kwargs = self.chat_template_kwargs if self.chat_template_kwargs is not None else cfg.chat_template_kwargs
        return kwargs or None

    def check(self, cfg: GenConfig) -> None:
        self.endpoint.check()
        if cfg.chat_template:
            raise ValueError("a chat template file applies to in-process gen; a server renders with the template "
                             "it was started with (vLLM/SGLang: --chat-template)")
        if self.num_samples < 1:
            raise ValueError("num_samples must be >= 1")
        if self.num_samples > 1 and cfg.temperature == 0:
            raise ValueError("num_samples > 1 needs temperature > 0: greedy replies are all the same")
        if self.reasoning not in ("keep", "drop"):
            raise ValueError(f"reasoning must be keep or drop, got {self.reasoning!r}")
