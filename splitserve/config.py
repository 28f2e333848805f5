"""One tree of typed dataclasses: every default lives here, `conf/` YAML holds differences.

Library code receives these plain dataclasses, never a Hydra DictConfig; `cli.py` converts
once at the edge (`OmegaConf.to_object`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TargetConfig:
    """The frozen target model and how its hidden states are captured."""

    name: str = "smollm2-135m"
    # "smollm2-135m" resolves to the embedded default; anything else is a HF model directory.
    path: str = "smollm2-135m"
    backend: str = "transformers"
    dtype: str = "float32"  # float32 | bfloat16
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # Captured layers (HF indexing: hidden_states[l + 1] is the output of layer l).
    # None means the default rule in target/layers.py with `num_capture_layers` layers.
    layer_ids: list[int] | None = None
    num_capture_layers: int = 5


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
    markov_head_type: str = "vanilla"  # vanilla | gated
    enable_confidence_head: bool = True
    mask_token_id: int | None = None  # None: pick an unused special token of the tokenizer
    rope_theta: float | None = None


@dataclass
class DataConfig:
    """Training conversations and held-out prompts."""

    name: str = "chitchat"
    # "chitchat" resolves to the embedded default; anything else is a chat JSONL path.
    train_path: str = "chitchat"
    heldout_prompts: str = "chitchat"
    max_length: int = 1024
    max_samples: int | None = None
    # A dump directory written by `splitserve dump`; when set, training reads it instead of
    # running the target in-process.
    dump_dir: str | None = None


@dataclass
class LossConfig:
    """Loss mix (DSPARK.md, "Losses"); `kind` selects the family."""

    name: str = "paper"
    kind: str = "paper"
    ce_weight: float = 0.1
    tv_weight: float = 0.9
    conf_weight: float = 1.0
    decay_gamma: float = 4.0  # g in w_k = exp(-(k-1)/g)


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping for one training run."""

    seed: int = 0
    max_steps: int = 1000
    max_minutes: float | None = None  # stop (and checkpoint) after this much training time
    batch_size: int = 4  # sequences per step
    anchors_per_seq: int = 64
    lr: float = 6e-4
    weight_decay: float = 0.0
    warmup_steps: int = 20
    grad_clip: float = 1.0
    log_every: int = 10
    save_every: int = 100
    device: str = "auto"
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


@dataclass
class DumpConfig:
    out_dir: str = "dumps/default"
    shard_tokens: int = 65536
    dtype: str = "bfloat16"


@dataclass
class RunConfig:
    target: TargetConfig = field(default_factory=TargetConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    data: DataConfig = field(default_factory=DataConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    dump: DumpConfig = field(default_factory=DumpConfig)
    run_dir: str = "runs/${draft.name}-${target.name}"
