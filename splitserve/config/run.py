"""`splitserve train | dump`: the RunConfig tree. Every default lives here; `conf/` YAML holds
differences, composed by Hydra (or by compose.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TargetConfig:
    """The frozen target model and how its hidden states are captured."""

    name: str = "smollm2-135m"
    # "smollm2-135m" resolves to the embedded default, "gemma3-270m" to the optional second real
    # target (splitserve/assets.py); anything else is a HF model directory.
    path: str = "smollm2-135m"
    revision: str | None = None  # a branch, tag or commit of a hub model (from_pretrained's `revision`)
    # Run the model's own code from its directory or repo (from_pretrained's `trust_remote_code`).
    trust_remote_code: bool = False
    backend: str = "transformers"  # transformers | sglang (CUDA, training and dump only; docs/sglang.md)
    dtype: str = "float32"  # float32 | bfloat16
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # Captured layers (HF indexing: hidden_states[l + 1] is the output of layer l).
    # None means the rule `layer_rule` in target/layers.py picks them. Every id must be
    # distinct: a rule that repeats a layer of a small target is refused at start.
    layer_ids: list[int] | None = None
    # spread: `num_capture_layers` layers spread over the target (DSpark's default); eagle3:
    # EAGLE-3's [1, N//2 - 1, N - 4] (three layers; num_capture_layers is not read); last: the
    # last layer alone (draft=mtp, the only use of the last layer).
    layer_rule: str = "spread"
    num_capture_layers: int = 5
    # transformers backend, training and dump: pad each sample to its power-of-two length bucket
    # and replay that bucket's forward as a CUDA graph (target/bucketed.py). None (default): on
    # when the target runs on CUDA, where it removes most of a step's host time
    # (docs/results/train_step_h200.md); off on CPU, where padding only adds work.
    capture_graphs: bool | None = None
    # With capture_graphs: samples of one length bucket L share a forward, group_tokens // L of
    # them (at least one), so a batch costs one graph replay per bucket instead of one per
    # sample. 0: one sample per forward.
    capture_group_tokens: int = 2048
    # sglang backend: share of the GPU SGLang may take for the target's weights and KV pool (the
    # draft trains on the same GPU).
    sglang_mem_fraction: float = 0.4


@dataclass
class DraftConfig:
    """Draft architecture. `family` picks the kind of draft (models/families.py): dspark, dflash
    (DSpark with markov_rank=0 and no confidence head: the baseline), eagle3, or mtp (the
    target's own MTP head, models/mtp.py)."""

    name: str = "dspark_b8"
    family: str = "dspark"  # dspark | dflash | eagle3 | mtp
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
    # dspark and dflash: the block attends to the last context_window context positions only
    # (p-W..p-1 for an anchor at p), in training and in serving alike; 0: the whole context.
    context_window: int = 0
    # eagle3 and mtp. Training-time test: unrolled draft steps per position (a served round's γ), and the weight
    # ttt_decay^j of step j's loss (speculators: 3 steps; SpecForge: 7 steps at 0.8).
    ttt_steps: int = 3
    ttt_decay: float = 0.8
    # The lm_head's vocabulary N: the most frequent trained tokens of the training data
    # (models/vocab_map.py), mapped back to target ids (d2t); capped at the target's vocabulary.
    # 0: the family's default, eagle3 32000 (EAGLE-3's usual), dspark and dflash the target's
    # whole vocabulary (a smaller N makes the draft's head products cheaper, docs/serving.md).
    draft_vocab_size: int = 0


@dataclass
class DataConfig:
    """Training conversations and held-out prompts."""

    name: str = "chitchat"
    # "chitchat" resolves to the embedded default; anything else is a data path: JSONL/JSON,
    # Parquet, Arrow, a save_to_disk directory, or a glob of files (docs/data.md).
    train_path: str = "chitchat"
    heldout_prompts: str = "chitchat"
    max_length: int = 1024
    # A row longer than max_length tokens: truncate (cut to it; counted in the data summary) | skip
    # (left out; counted under its own reason)
    overlong: str = "truncate"
    # Join consecutive conversations into rows of at most this many tokens (<= max_length): long
    # rows of real text for long-context training (data/concat.py); 0: one row per conversation.
    concat_to: int = 0
    max_samples: int | None = None
    # The tokens the draft learns to predict: "assistant" (the replies, as a chat server is asked
    # for them) | "all" (every token after the first, whoever wrote it: for raw-text workloads such
    # as bench_serving's random prompts, where the target continues the user's text).
    loss_on: str = "assistant"
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
    kind "ttt" is EAGLE-3's training-time-test loss over unrolled draft steps (draft=eagle3
    sets it): kl_weight * KL(target || draft) on the draft vocabulary, plus ce_weight * CE and
    tv_weight * TV, step j weighted by draft.ttt_decay^j (train/losses.py).
    """

    name: str = "paper"
    kind: str = "paper"  # paper | prefix | ttt
    ce_weight: float = 0.1
    tv_weight: float = 0.9
    conf_weight: float = 1.0
    kl_weight: float = 0.0  # kind=ttt only: forward KL to the target's distribution
    # g in w_k = exp(-(k-1)/g). None: the value published for the block size (decay_for below).
    decay_gamma: float | None = None
    # kind=prefix only. CE/TV weights per slot k: decay = exp(-(k-1)/g); survival = P_{k-1};
    # gain = dE[tau]/d alpha_k. The confidence BCE always keeps the decay weights.
    weighting: str = "decay"  # decay | survival | gain
    acc_weight: float = 0.0  # weight of L_acc = -E[tau]/γ
    # kind=prefix only. The per-slot distance term: tv = ||p_d - p_t||_1; log_accept =
    # -2 log alpha_k, the negative log acceptance of LK losses (arXiv 2602.23881), equal to tv to
    # first order but with its gradient scaled by 1/alpha_k, so a slot the draft gets badly wrong
    # is not starved of gradient.
    distance: str = "tv"  # tv | log_accept
    # kind=prefix only. The acceptance behind P_k (survival and gain weights, L_acc): tv =
    # 1 - ||p_d - p_t||_1 / 2, rejection sampling's at T=1; greedy = p_d(argmax p_t), a smooth
    # stand-in for greedy verification's test (draft token == target argmax). The confidence
    # head's labels stay the tv acceptance.
    acceptance: str = "tv"  # tv | greedy


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
    # Compute the vocabulary-wide part of the loss (both lm_heads, softmaxes, CE and TV) this
    # many block positions at a time, recomputing each chunk in the backward, so its memory is
    # one chunk's (rows x V) tensors instead of every position's (train/step.py,
    # chunked_row_terms). 0: all positions at once. For large vocabularies or all anchors.
    loss_chunk_rows: int = 0
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
