"""Resolve a DraftConfig against a concrete target into its family's arch, and build the draft.

Every draft family registers here with its resolver (models/families.py is the registry):
    dspark   DSparkDraft with its Markov and confidence heads
    dflash   the same class without them (markov_rank 0, no confidence head): the baseline
    eagle3   Eagle3Draft (models/eagle3.py)
    mtp      MtpDraft (models/mtp.py): the target's own MTP layers, started from its weights
"""

from __future__ import annotations

import json
from typing import Any

from splitserve.config import DraftConfig
from splitserve.errors import UserError
from splitserve.models.dspark import DSparkArch, DSparkDraft
from splitserve.models.eagle3 import Eagle3Arch, Eagle3Draft
from splitserve.models.families import DraftFamily, get_family, model_class, register
from splitserve.models.mtp import MtpArch, MtpDraft, require_mtp_layout, text_config
from splitserve.records import TargetInfo


EAGLE3_DRAFT_VOCAB = 32000  # EAGLE-3's usual draft vocabulary (SpecForge, speculators)


class DraftMismatchError(ValueError):
    """A draft was built or exported for another target."""


def pick_mask_token(tokenizer: Any, vocab_size: int) -> int:
    """A token the target never produces in chat: the tokenizer's mask token if it has one,
    else the highest-id special token that is not bos/eos/pad/unk and not in the chat template.
    """
    if tokenizer is None:
        return vocab_size - 1
    if getattr(tokenizer, "mask_token_id", None) is not None:
        return int(tokenizer.mask_token_id)
    reserved = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    template = getattr(tokenizer, "chat_template", None) or ""
    candidates = [
        int(i)
        for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items()
        if int(i) not in reserved and str(tok) not in template and int(i) < vocab_size
    ]
    return max(candidates) if candidates else vocab_size - 1


def _target_shapes(cfg: DraftConfig, info: TargetInfo, target_config: Any) -> dict:
    """The draft's attention/MLP shapes and norm/RoPE constants: the config's where set, else
    the target's (a multimodal target config is read through its text part)."""
    if hasattr(target_config, "get_text_config"):
        target_config = target_config.get_text_config()
    # a target without attention (a pure Mamba) gives the draft 64-wide heads
    n_heads = cfg.num_heads or getattr(target_config, "num_attention_heads", None) or max(1, info.hidden_size // 64)
    head_dim = cfg.head_dim or getattr(target_config, "head_dim", None) or info.hidden_size // n_heads
    rope = cfg.rope_theta
    if rope is None:
        params = getattr(target_config, "rope_parameters", None) or {}
        params = params.get("full_attention", params)  # Gemma-3: one set per layer type
        rope = params.get("rope_theta", getattr(target_config, "rope_theta", 10000.0))
    return dict(
        num_heads=n_heads,
        num_kv_heads=cfg.num_kv_heads or getattr(target_config, "num_key_value_heads", n_heads),
        head_dim=head_dim,
        intermediate_size=cfg.intermediate_size or _dense_width(target_config),
        rms_norm_eps=float(getattr(target_config, "rms_norm_eps", 1e-6)),
        rope_theta=float(rope),
    )


def resolve_dspark(cfg: DraftConfig, info: TargetInfo, target_config: Any, tokenizer: Any = None) -> DSparkArch:
    """target_config: the target's HF config, for default attention/MLP shapes."""
    if cfg.block_size < 1:
        raise ValueError(f"draft.block_size must be >= 1, got {cfg.block_size}")
    if cfg.context_window < 0:
        raise UserError(f"draft.context_window={cfg.context_window}: must be >= 0 (0: the whole context)")
    _check_vocab_size(cfg)
    return DSparkArch(
        vocab_size=info.vocab_size,
        hidden_size=info.hidden_size,
        num_layers=cfg.num_layers,
        **_target_shapes(cfg, info, target_config),
        block_size=cfg.block_size,
        mask_token_id=(cfg.mask_token_id if cfg.mask_token_id is not None
                       else pick_mask_token(tokenizer, info.vocab_size)),
        target_layer_ids=tuple(info.layer_ids),
        markov_rank=cfg.markov_rank,
        markov_head_type=cfg.markov_head_type,
        enable_confidence_head=cfg.enable_confidence_head,
        context_window=cfg.context_window,
        draft_vocab_size=cfg.draft_vocab_size if cfg.draft_vocab_size < info.vocab_size else 0,
        target_name=info.name,
        target_num_layers=info.num_layers,
    )


def _check_vocab_size(cfg: DraftConfig) -> None:
    if cfg.draft_vocab_size < 0:
        raise UserError(f"draft.draft_vocab_size={cfg.draft_vocab_size}: must be >= 0 (0: the family's default)")


def resolve_dflash(cfg: DraftConfig, info: TargetInfo, target_config: Any, tokenizer: Any = None) -> DSparkArch:
    """DSpark's resolver for a draft without heads; a head asked for is refused, not dropped."""
    if cfg.markov_rank or cfg.enable_confidence_head:
        raise UserError(f"draft.family=dflash has no Markov or confidence head (draft.markov_rank={cfg.markov_rank}, "
                        f"draft.enable_confidence_head={cfg.enable_confidence_head}): set them to 0 and false, or "
                        "use draft.family=dspark")
    return resolve_dspark(cfg, info, target_config, tokenizer)


def resolve_eagle3(cfg: DraftConfig, info: TargetInfo, target_config: Any, tokenizer: Any = None) -> Eagle3Arch:
    """EAGLE-3 over the target's captured layers (three in its recipe, any number accepted)."""
    if cfg.ttt_steps < 1:
        raise UserError(f"draft.ttt_steps={cfg.ttt_steps}: must be at least 1")
    _check_vocab_size(cfg)
    return Eagle3Arch(
        vocab_size=info.vocab_size,
        hidden_size=info.hidden_size,
        num_layers=cfg.num_layers,
        **_target_shapes(cfg, info, target_config),
        target_layer_ids=tuple(info.layer_ids),
        draft_vocab_size=min(cfg.draft_vocab_size or EAGLE3_DRAFT_VOCAB, info.vocab_size),
        ttt_steps=cfg.ttt_steps,
        target_name=info.name,
        target_num_layers=info.num_layers,
    )


def resolve_mtp(cfg: DraftConfig, info: TargetInfo, target_config: Any, tokenizer: Any = None) -> MtpArch:
    """The target's own MTP layers; a target whose config declares none is refused in one line
    (before any weight loads when called from the config alone, checks.py)."""
    layout = require_mtp_layout(target_config)
    if cfg.ttt_steps < 1:
        raise UserError(f"draft.ttt_steps={cfg.ttt_steps}: must be at least 1")
    if tuple(info.layer_ids) != (info.num_layers - 1,):
        raise UserError(f"draft=mtp reads the target's last layer (layer id {info.num_layers - 1}), not "
                        f"target.layer_ids {list(info.layer_ids)}: set target.layer_rule=last (draft=mtp sets it)")
    return MtpArch(
        vocab_size=info.vocab_size,
        hidden_size=info.hidden_size,
        target_layer_ids=tuple(info.layer_ids),
        # as draft_arch.json gives it back (lists, not tuples), so a resumed run compares equal
        target_config=json.loads(text_config(target_config).to_json_string(use_diff=False)),
        style=layout.style,
        field=layout.field,
        num_mtp_layers=layout.num_layers,
        ttt_steps=cfg.ttt_steps,
        target_name=info.name,
        target_num_layers=info.num_layers,
    )


def resolve_arch(cfg: DraftConfig, info: TargetInfo, target_config: Any, tokenizer: Any = None):
    """The arch of cfg.family for this target (an unknown family: one-line UserError)."""
    return get_family(cfg.family).resolve(cfg, info, target_config, tokenizer)


def _dense_width(target_config) -> int:
    """The target's dense MLP width; an all-MoE target (Qwen3.5-MoE) has none, and the draft's
    one dense MLP takes its shared expert's width, else one routed expert's; a target with no
    MLP at all (a pure Mamba) gives the usual 4 x hidden."""
    for name in ("intermediate_size", "shared_expert_intermediate_size", "moe_intermediate_size"):
        width = getattr(target_config, name, None)
        if width:
            return int(width)
    return 4 * int(target_config.hidden_size)


def check_compatible(arch, info: TargetInfo, where: str = "draft") -> None:
    """Refuse a draft (any family's arch) made for another target, before any compute, naming
    every difference."""
    diffs = []
    if arch.vocab_size != info.vocab_size:
        diffs.append(f"vocab size {arch.vocab_size} vs target {info.vocab_size}")
    if arch.hidden_size != info.hidden_size:
        diffs.append(f"hidden size {arch.hidden_size} vs target {info.hidden_size}")
    top = info.num_layers if getattr(arch, "reads_last_layer", False) else info.num_layers - 1
    bad = [i for i in arch.target_layer_ids if not 0 <= i < top]
    if bad:
        diffs.append(f"captured layer ids {bad} do not exist below the last layer of a {info.num_layers}-layer target")
    elif tuple(arch.target_layer_ids) != tuple(info.layer_ids):
        diffs.append(f"captured layer ids {list(arch.target_layer_ids)} vs target {list(info.layer_ids)}")
    if arch.target_num_layers and arch.target_num_layers != info.num_layers:
        diffs.append(f"target layer count {arch.target_num_layers} vs {info.num_layers}")
    if diffs:
        raise DraftMismatchError(
            f"{where} was made for target '{arch.target_name}' and does not fit target "
            f"'{info.name}': " + "; ".join(diffs)
        )


def build_draft(arch, target):
    """A fresh draft of the arch's family with the target's embedding and lm_head copied in
    (frozen), and the target's logit transform (soft-capping, scaling; None: raw lm_head
    logits), which training applies to the target's distribution it distils from. A family
    whose weights start as the target's own (mtp) reads them through `init_from_target`."""
    check_compatible(arch, target.info)
    draft = model_class(arch)(arch)
    draft.load_shared(target.embed_weight(), target.lm_head_weight())
    if hasattr(draft, "init_from_target"):
        draft.init_from_target(target)
    draft.target_logit_transform = getattr(target, "logit_transform", None)
    return draft.to(target.device)


def untrained_like(draft, target):
    """A freshly initialised draft of `draft`'s arch for `target` (build_draft), with `draft`'s
    vocabulary map where its family has one: a baseline that differs from it only by training."""
    fresh = build_draft(draft.arch, target)
    if hasattr(fresh, "set_vocab") and getattr(draft, "vocab", None) is not None:
        fresh.set_vocab(draft.vocab)
    return fresh


def _describe_dspark(a: DSparkArch) -> str:
    window = f", context window {a.context_window}" if a.context_window else ""
    vocab = f", draft vocabulary {a.draft_vocab_size:,} of {a.vocab_size:,}" if a.reduced else ""
    return f"{a.num_layers} layers, γ={a.block_size}, markov_rank={a.markov_rank}{window}{vocab}"


def _describe_eagle3(a: Eagle3Arch) -> str:
    return (f"EAGLE-3, {a.num_layers} layer(s), {a.ttt_steps} training-time-test steps, "
            f"draft vocabulary {a.draft_vocab_size:,} of {a.vocab_size:,}")


def _describe_mtp(a: MtpArch) -> str:
    return (f"the target's own MTP head ({a.num_mtp_layers} layer(s) from {a.field}, {a.style} layout), "
            f"{a.ttt_steps} chain steps")


register(DraftFamily("dspark", DSparkArch, DSparkDraft, resolve_dspark, _describe_dspark))
register(DraftFamily("dflash", DSparkArch, DSparkDraft, resolve_dflash, _describe_dspark))
register(DraftFamily("eagle3", Eagle3Arch, Eagle3Draft, resolve_eagle3, _describe_eagle3))
register(DraftFamily("mtp", MtpArch, MtpDraft, resolve_mtp, _describe_mtp))
