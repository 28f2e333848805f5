"""One tree of typed dataclasses: every default lives here, `conf/` YAML holds differences.

RunConfig is `splitserve train | dump` (composed by Hydra from `conf/`, or by `compose` below);
every other command's settings are the dataclasses after it, and `cli.py` builds each command's
flags from their fields (cli.bind), so a default is written once. Library code receives these
plain dataclasses, never a Hydra DictConfig; `cli.py` converts once at the edge.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class TargetConfig:
    """The frozen target model and how its hidden states are captured."""

    name: str = "smollm2-135m"
    # "smollm2-135m" resolves to the embedded default; anything else is a HF model directory.
    path: str = "smollm2-135m"
    revision: str | None = None  # a branch, tag or commit of a hub model (from_pretrained's `revision`)
    # Run the model's own code from its directory or repo (from_pretrained's `trust_remote_code`).
    trust_remote_code: bool = False
    backend: str = "transformers"  # transformers | sglang (CUDA, training and dump only; docs/sglang.md)
    dtype: str = "float32"  # float32 | bfloat16
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # Captured layers (HF indexing: hidden_states[l + 1] is the output of layer l).
    # None means the default rule in target/layers.py with `num_capture_layers` layers.
    layer_ids: list[int] | None = None
    num_capture_layers: int = 5
    # transformers backend, training and dump: pad each sample to its power-of-two length bucket
    # and replay that bucket's forward as a CUDA graph (target/bucketed.py). None (default): on
    # when the target runs on CUDA, where it made a training step 2.5-3x faster on an H200
    # (docs/results/train_step_h200.md); off on CPU, where padding only adds work.
    capture_graphs: bool | None = None
    # sglang backend: share of the GPU SGLang may take for the target's weights and KV pool (the
    # draft trains on the same GPU).
    sglang_mem_fraction: float = 0.4


@dataclass
class DraftConfig:
    """DSpark draft architecture. `markov_rank=0` is the DFlash-style baseline."""

    name: str = "dspark_b8"
    block_size: int = 8  # γ: draft positions per round (anchor + γ-1 masks -> γ draft tokens)
    num_layers: int = 5
    # None: copy the target's attention/MLP shapes (hidden size always equals the target's,
    # since the draft shares its embedding and lm_head).
    num_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int | None = None
    markov_rank: int = 256
    markov_head_type: str = "vanilla"  # vanilla | gated | rnn (models/heads.py)
    enable_confidence_head: bool = True
    mask_token_id: int | None = None  # None: pick an unused special token of the tokenizer
    rope_theta: float | None = None


@dataclass
class DataConfig:
    """Training conversations and held-out prompts."""

    name: str = "chitchat"
    # "chitchat" resolves to the embedded default; anything else is a data path: JSONL/JSON,
    # Parquet, Arrow, a save_to_disk directory, or a glob of files (docs/data.md).
    train_path: str = "chitchat"
    heldout_prompts: str = "chitchat"
    max_length: int = 1024
    max_samples: int | None = None
    # A Jinja file replacing the tokenizer's chat template, for training rows and held-out prompts.
    chat_template: str | None = None
    # Handed to the chat template, e.g. for Qwen3: +data.chat_template_kwargs.enable_thinking=false
    # (the "+" adds a key to this dict).
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # A bad row (malformed, or replies the template does not let us locate) is an error naming its
    # file and row, instead of being skipped and counted.
    strict: bool = False
    num_proc: int | None = None  # tokenizer processes (datasets.map); None: the calling process
    # Keep tokenized samples under the splitserve cache dir, keyed by data files, tokenizer,
    # template and max_length: a rerun, and the other target ranks of a split job, read them back.
    cache: bool = True
    # A dump directory written by `splitserve dump`; when set, training reads it instead of
    # running the target in-process.
    dump_dir: str | None = None


@dataclass
class LossConfig:
    """Loss mix (DSPARK.md, "Losses"; docs/losses.md); `kind` selects the family.

    kind "paper" is the paper's recipe exactly. kind "prefix" is the acceptance-aware family:
    the same three terms with CE/TV position weights chosen by `weighting`, plus
    `acc_weight * L_acc`, L_acc = -E[tau]/γ (teacher-forced expected acceptance length).
    """

    name: str = "paper"
    kind: str = "paper"  # paper | prefix
    ce_weight: float = 0.1
    tv_weight: float = 0.9
    conf_weight: float = 1.0
    # g in w_k = exp(-(k-1)/g). None: the value published for the block size (decay_for below).
    decay_gamma: float | None = None
    # kind=prefix only. CE/TV weights per slot k: decay = exp(-(k-1)/g); survival = P_{k-1};
    # gain = dE[tau]/d alpha_k. The confidence BCE always keeps the decay weights.
    weighting: str = "decay"  # decay | survival | gain
    acc_weight: float = 0.0  # weight of L_acc = -E[tau]/γ


# The position decay g published per block size: 4 at γ <= 8 (DeepSpec's DSpark and DFlash
# configs use 4 at block 7; the DFlash paper 4 at block 8), 5 at γ <= 10 and 7 at γ = 16
# (the DFlash paper and SpecForge's DFlash recipes). A longer block keeps more weight on its
# later slots, which the longer accepted prefixes of a larger γ reach.
DECAY_BY_BLOCK = ((8, 4.0), (10, 5.0))
DECAY_LONG_BLOCK = 7.0


def decay_for(loss: LossConfig, block_size: int) -> float:
    """g for a block of `block_size`: loss.decay_gamma when set, else the published value."""
    if loss.decay_gamma is not None:
        return float(loss.decay_gamma)
    for limit, g in DECAY_BY_BLOCK:
        if block_size <= limit:
            return g
    return DECAY_LONG_BLOCK


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping for one training run."""

    seed: int = 0
    max_steps: int = 1000
    max_minutes: float | None = None  # stop (and checkpoint) after this much training time
    batch_size: int = 4  # sequences per step
    anchors_per_seq: int = 64
    lr: float = 6e-4
    # The Markov head's learning rate as a multiple of lr: its 2 x V x r parameters are most of
    # the draft, and each embedding row is updated only when its token is a previous token.
    markov_lr_scale: float = 1.0
    weight_decay: float = 0.0
    warmup_steps: int = 20
    grad_clip: float = 1.0
    log_every: int = 10
    save_every: int = 100
    keep_checkpoints: int = 2  # newest checkpoints kept (0: all, e.g. to measure τ along training)
    device: str = "auto"
    # Draft-side optimisation backend: "plain" (torch AdamW; gradients all-reduced over the
    # draft ranks in a split job) or "deepspeed" (ZeRO, config generated by train/backends.py).
    backend: str = "plain"
    zero_stage: int = 1  # deepspeed only: 1 or 2
    grad_accum_steps: int = 1  # micro-batches per optimiser step on each draft rank
    precision: str = "fp32"  # fp32 | bf16 (bf16 autocast for the draft forward; GPU)
    wandb: bool = False
    wandb_project: str = "splitserve"


@dataclass
class EvalConfig:
    """Held-out speculative-decoding evaluation run at the end of training."""

    enabled: bool = True
    num_prompts: int = 20
    max_new_tokens: int = 64
    temperature: float = 0.0
    compare_untrained: bool = True
    # Greedy only: also decode each prompt with the target alone and count the replies the
    # speculative loop reproduced exactly (one plain decode per prompt, about 40% of the
    # evaluation's time; losslessness itself is covered by the tests).
    check_exact: bool = True
    # Decode through the serving engine (static caches, CUDA graphs on a GPU) instead of the
    # reference loop: greedy, the same rounds; minutes become seconds on a GPU.
    engine: bool = False
    # Further sampling temperatures at which the trained draft is also measured, e.g. [1.0] for
    # τ at T=1 in ablation reports; each adds a "trained@T=<t>" entry to eval.json.
    extra_temperatures: list[float] = field(default_factory=list)
    # Further held-out prompt sets measured next to data.heldout_prompts: names of
    # data/prompt_sets.py ("humaneval", "mtbench", "mtbench2") or prompt files; each at every
    # temperature above, as "trained[<set>]" entries of eval.json.
    prompt_sets: list[str] = field(default_factory=list)
    # Replace the assistant turns of every prompt's history by the target's own greedy replies
    # (at most max_new_tokens each) before measuring: a served conversation's history is the
    # target's, not the human-written turns of a dataset.
    regenerate_history: bool = False
    # Fit STS temperatures for the confidence head on the trained draft's held-out rounds and
    # write calibration.json (DSPARK.md, "Sequential Temperature Scaling"); costs one host read
    # per round, no extra decoding.
    calibrate: bool = True
    calibration_bins: int = 10


@dataclass
class DumpConfig:
    out_dir: str = "dumps/default"
    shard_tokens: int = 65536
    dtype: str = "bfloat16"


@dataclass
class SplitConfig:
    """How one torchrun world is divided between target ranks and draft ranks.

    Only used when the job has more than one rank (WORLD_SIZE > 1). The first
    `num_target_ranks` ranks run the frozen target unless `target_ranks` lists them; every
    other rank trains the draft.
    """

    name: str = "none"
    num_target_ranks: int = 1
    target_ranks: list[int] | None = None
    credits: int = 4  # records a target rank may have in flight to each draft rank
    prefetch: int = 2  # records a draft rank receives ahead of the step that needs them
    wire_dtype: str = "float32"  # float32 | bfloat16: hidden states on the wire
    max_tokens: int | None = None  # receive buffer length; None: data.max_length
    # auto: nccl when every rank of the job has a GPU of its own, else gloo.
    # nccl (a GPU per rank): payloads GPU to GPU, headers and credits over gloo.
    # gloo: records staged through host memory, whether ranks share a GPU or not.
    transport: str = "auto"  # auto | gloo | nccl
    heartbeat_s: float = 1.0
    stale_after_s: float = 30.0  # a rank silent this long is declared dead


@dataclass
class RunConfig:
    target: TargetConfig = field(default_factory=TargetConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    data: DataConfig = field(default_factory=DataConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    dump: DumpConfig = field(default_factory=DumpConfig)
    split: SplitConfig = field(default_factory=SplitConfig)
    run_dir: str = "runs/${draft.name}-${target.name}"


# --- composing a RunConfig from conf/ (what `splitserve train` sees) ---

PACKAGE_CONF = Path(__file__).resolve().parent / "conf"  # package data: ships in the wheel
GROUPS = ("target", "draft", "data", "loss", "split", "experiment")  # the conf/ groups


def conf_dir() -> Path:
    """The Hydra config tree: the package's own, or SPLITSERVE_CONF to use a copy of it."""
    env = os.environ.get("SPLITSERVE_CONF")
    path = Path(env) if env else PACKAGE_CONF
    if not (path / "config.yaml").exists():
        raise FileNotFoundError(f"no Hydra config at {path} (SPLITSERVE_CONF must name a directory holding "
                                "config.yaml)")
    return path


def compose(overrides: list[str] | tuple[str, ...] = (), conf: str | Path | None = None) -> RunConfig:
    """The RunConfig `splitserve train OVERRIDES...` runs, e.g.
    compose(["draft=dspark_b16", "loss=paper", "train.lr=3e-4"]): Hydra's compose API where Hydra
    is installed, else the same composition in plain Python (compose_plain: for GPU hosts with only
    torch and transformers; tests/test_compose.py holds the two equal)."""
    conf = Path(conf) if conf is not None else conf_dir()
    try:
        import hydra  # noqa: F401
    except ImportError:
        return compose_plain(list(overrides), conf)
    return compose_hydra(list(overrides), conf)


def compose_hydra(overrides: list[str], conf: Path) -> RunConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    ConfigStore.instance().store(name="base_config", node=RunConfig)
    with initialize_config_dir(config_dir=str(conf.resolve()), version_base="1.3"):
        return OmegaConf.to_object(hydra_compose(config_name="config", overrides=overrides))


def compose_plain(overrides: list[str], conf: Path) -> RunConfig:
    """Hydra's composition of conf/, for the subset of it this tree uses: config.yaml's defaults
    list (a group option each, `_self_`, an optional experiment), group files merged into their
    group or, under `# @package _global_`, into the root, an experiment's own defaults list, and
    overrides `group=option`, `key=value` and `+key=value` (a new key of a dict field)."""
    import yaml

    choices, sets = {}, []
    for o in overrides:
        key, sep, text = o.partition("=")
        if not sep:
            raise ValueError(f"override {o!r} is not key=value")
        if key in GROUPS:
            choices[key] = text
        else:
            sets.append((key, text))
    tree = dataclasses.asdict(RunConfig())

    def load(group: str | None, name: str) -> None:
        path = conf / (f"{group}/{name}.yaml" if group else f"{name}.yaml")
        text = path.read_text()
        data = yaml.safe_load(text) or {}
        global_ = "@package _global_" in "".join(text.splitlines()[:1])
        entries = data.pop("defaults", None) or []
        data.pop("hydra", None)
        if "_self_" not in entries:
            entries = [*entries, "_self_"]
        for entry in entries:
            if entry == "_self_":
                _merge(tree if global_ or group is None else tree[group], data, f"{path}")
            elif isinstance(entry, str):  # "base_config" (the tree above), or an option of this file's group
                if group:
                    load(group, entry)
            else:
                (g, option), = entry.items()
                option = choices.get(g, option)
                if option not in (None, "null"):
                    load(g, option)

    for g in choices:
        if g not in GROUPS or not (conf / g / f"{choices[g]}.yaml").exists():
            raise ValueError(f"override {g}={choices[g]}: no such option in {conf / g}")
    load(None, "config")
    for key, text in sets:
        *parents, leaf = key.lstrip("+").split(".")
        node = tree
        for k in parents:
            node = node[k]
        if leaf not in node and not key.startswith("+"):
            raise KeyError(f"could not override {key!r}: no such key (to add one: +{key}={text})")
        node[leaf] = yaml.safe_load(text) if text else ""
    return from_dict(RunConfig, _interpolate(tree, tree))


def _merge(into: dict, data: dict, where: str) -> None:
    for k, v in data.items():
        if k not in into:
            raise KeyError(f"{where}: {k!r} is not a config key")
        if isinstance(v, dict) and isinstance(into[k], dict) and into[k] and k != "chat_template_kwargs":
            _merge(into[k], v, where)
        else:
            into[k] = v


def _interpolate(value, root: dict):
    """${a.b} references, as OmegaConf resolves them (run_dir: runs/${draft.name}-${target.name})."""
    import re

    if isinstance(value, dict):
        return {k: _interpolate(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, root) for v in value]
    if isinstance(value, str):
        def lookup(m):
            node = root
            for k in m.group(1).split("."):
                node = node[k]
            return str(node)

        return re.sub(r"\$\{([\w.]+)\}", lookup, value)
    return value


def from_dict(cls, data: dict):
    """A dict (e.g. a run's config.yaml, read with yaml.safe_load) -> the dataclass `cls`, nested
    dataclasses included; values are converted to the field types as OmegaConf does (YAML's "3e-3"
    is a string, a float field's value a float). An unknown key is a TypeError."""
    import typing

    hints = typing.get_type_hints(cls)
    return cls(**{k: _coerce(hints[k], v) for k, v in data.items()})


def _coerce(hint, value):
    import types
    import typing

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        return _coerce(next(a for a in args if a is not type(None)), value)
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value)
    if origin in (list, tuple):
        return origin(_coerce(args[0], v) for v in value) if value is not None else value
    if hint is bool and isinstance(value, str):
        return {"true": True, "false": False}[value.lower()]
    if hint in (int, float) and isinstance(value, (str, int)) and not isinstance(value, bool):
        return hint(value)
    if hint is str and isinstance(value, (int, float)):
        return str(value)
    return value


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
