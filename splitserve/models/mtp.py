"""The target's own multi-token-prediction (MTP) head as an autoregressive draft (`draft=mtp`).

Targets such as DeepSeek-V3, GLM-4.5 and Qwen3-Next ship K MTP layers next to their decoder.
One MTP step reads the target's state h_t with the token x_{t+1} that followed it and predicts x_{t+2}:

    x   = proj([enorm(e(x_{t+1})) ; hnorm(h_t)])          2D -> D
    o_t = out_norm(block(x))                             block: one decoder layer of the target's own kind
    logits = lm_head(o_t)                                the target's lm_head

Checkpoint layouts (`MtpLayout`), as vLLM 0.33.0 and SGLang 0.5.23 load them:
    nextn  DeepSeek-V3, GLM-4.5 (`num_nextn_predict_layers` = K): layer k under model.layers.{N+k}.:
           enorm, hnorm, eh_proj, shared_head.norm (out_norm) and the decoder layer's own weights
    mtp    Qwen3-Next, Qwen3.5 (`mtp_num_hidden_layers` = K): mtp.pre_fc_norm_embedding (enorm),
           mtp.pre_fc_norm_hidden (hnorm), mtp.fc (proj) and mtp.norm (out_norm), shared by the K
           full-attention layers mtp.layers.{k}.
The decoder layers are built from the target's own transformers class, so MLA, MoE and gated
attention come from transformers, not from here; every norm is the target's norm class (Qwen3-Next's
is 1 + w). The weights are read from the target's checkpoint (target/mtp_weights.py), where
transformers' loader drops them.

States (checked in both engines' source): step 0 reads the target's output after its final norm
(vLLM passes the model's `hidden_states`, deepseek_v2.py `self.norm(hidden_states, residual)`).
We capture the output of the target's last layer (target.layer_rule=last) and apply `target_norm`,
a frozen copy of the target's final norm, in `fuse`. A later chain step reads the previous step's
o_t, after out_norm (vLLM deepseek_mtp.py returns `self.shared_head(hidden_states)` as the state it
recycles, SGLang deepseek_nextn.py applies shared_head.norm before returning; Qwen3-Next's mtp.norm
likewise). Step j uses layer j mod K (vLLM's DeepSeek rule); all steps share one KV cache.

RoPE positions: this code reads entry t at position t+1 as EAGLE-3 does (models/eagle3.py); vLLM
uses t. RoPE attention depends on position differences only, so the two agree.

Interface: the chain draft's (speculative/eagle3_chain.py): fuse, backbone, draft_logits,
target_logits, unroll, vocab (the whole target vocabulary). Glossary: B batch, T tokens, U = T-1,
Q rows read at once, S cached positions, D hidden, V vocab, K MTP layers.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from splitserve.errors import UserError
from splitserve.models.eagle3 import chunk_mask, unroll_chain
from splitserve.models.families import ArchRecord
from splitserve.models.vocab_map import VocabMap

# The config fields that declare MTP layers, as vLLM's speculative config reads them.
FIELDS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")
MTP_STYLE_TYPES = ("qwen3_next", "qwen3_5")  # model types whose MTP sits under `mtp.`


@dataclass(frozen=True)
class MtpLayout:
    style: str  # "nextn" | "mtp"
    field: str  # the config field that declares the layers
    num_layers: int  # K

    def block_prefix(self, k: int, num_target_layers: int) -> str:
        """Checkpoint prefix of MTP layer k's decoder-layer weights."""
        return f"model.layers.{num_target_layers + k}." if self.style == "nextn" else f"mtp.layers.{k}."

    def head_keys(self, num_target_layers: int) -> dict[str, str]:
        """checkpoint key -> this draft's name, for the weights around the decoder layers."""
        if self.style == "mtp":
            return {"mtp.pre_fc_norm_embedding.weight": "heads.0.enorm.weight",
                    "mtp.pre_fc_norm_hidden.weight": "heads.0.hnorm.weight",
                    "mtp.fc.weight": "heads.0.proj.weight", "mtp.norm.weight": "out_norms.0.weight"}
        out = {}
        for k in range(self.num_layers):
            p = f"model.layers.{num_target_layers + k}."
            out |= {p + "enorm.weight": f"heads.{k}.enorm.weight", p + "hnorm.weight": f"heads.{k}.hnorm.weight",
                    p + "eh_proj.weight": f"heads.{k}.proj.weight", p + "shared_head.norm.weight": f"out_norms.{k}.weight"}
        return out

    def extra_prefixes(self, num_target_layers: int) -> tuple[str, ...]:
        """Keys under the MTP prefixes that are neither the head nor the block: the target's
        shared tensors (embed_tokens, shared_head.head), which the draft takes from the target."""
        if self.style == "mtp":
            return ()
        return tuple(f"model.layers.{num_target_layers + k}.{name}." for k in range(self.num_layers)
                     for name in ("embed_tokens", "shared_head.head"))


def text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def mtp_layout(config: Any) -> MtpLayout | None:
    """The MTP layers a target's HF config declares; None when it has none."""
    tc = text_config(config)
    kind = str(getattr(tc, "model_type", ""))
    for field in FIELDS:
        k = int(getattr(tc, field, 0) or 0)
        if k > 0:
            if kind.startswith("nemotron_h"):
                raise UserError(f"draft=mtp: {kind}'s MTP layers (hybrid blocks under mtp.layers.*) are not "
                                "supported yet; DeepSeek-V3/GLM-4.5 (model.layers.N+k) and Qwen3-Next/Qwen3.5 "
                                "(mtp.*) are")
            return MtpLayout("mtp" if kind.startswith(MTP_STYLE_TYPES) else "nextn", field, k)
    return None


def require_mtp_layout(config: Any) -> MtpLayout:
    """mtp_layout, or a one-line UserError naming the config fields."""
    layout = mtp_layout(config)
    if layout is None:
        tc = text_config(config)
        arch = (getattr(config, "architectures", None) or [type(config).__name__])[0]
        found = ", ".join(f"{f}={getattr(tc, f)}" for f in FIELDS if hasattr(tc, f)) or "neither is set"
        raise UserError(f"draft=mtp: {arch} has no MTP layers ({' / '.join(FIELDS)} is 0 or absent: {found}); "
                        "use a target that ships them (DeepSeek-V3, GLM-4.5, Qwen3-Next, ...) or another "
                        "draft family")
    return layout


@dataclass(frozen=True)
class MtpArch(ArchRecord):
    """The MTP draft: the target's MTP layers as its config declares them, plus the target identity."""

    vocab_size: int
    hidden_size: int
    target_layer_ids: tuple[int, ...]  # (N-1,): the last layer, whose output the final norm turns into h_t
    target_config: dict  # the target's text config (HF to_dict): the decoder layers are built from it
    style: str  # MtpLayout.style
    field: str  # MtpLayout.field
    num_mtp_layers: int  # K
    ttt_steps: int = 3  # chain steps a round drafts, and the training-time-test depth
    target_name: str = ""
    target_num_layers: int = 0

    reads_last_layer = True  # check_compatible: its captured layer is the target's last one

    @property
    def block_size(self) -> int:
        """γ: the tokens a served round drafts, one chain step each."""
        return self.ttt_steps

    @property
    def layout(self) -> MtpLayout:
        return MtpLayout(self.style, self.field, self.num_mtp_layers)


def block_config(arch: MtpArch) -> Any:
    """The target's config for a decoder of the K MTP layers: K full-attention layers, MoE where
    the target's MTP layer is (its index N+k is past first_k_dense_replace, as vLLM builds it),
    SDPA attention (the chain passes boolean masks)."""
    from transformers import AutoConfig

    d = copy.deepcopy(arch.target_config)
    config = AutoConfig.for_model(d.pop("model_type"), **d)
    config.num_hidden_layers = arch.num_mtp_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = ["full_attention"] * arch.num_mtp_layers
    if getattr(config, "first_k_dense_replace", None):
        config.first_k_dense_replace = 0
    config._attn_implementation = "sdpa"
    return config


def target_classes(config: Any) -> tuple[type, type, type]:
    """(decoder layer, norm, rotary embedding) classes of the target's model, built on the meta device."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        decoder = AutoModelForCausalLM.from_config(config).get_decoder()
    return type(decoder.layers[0]), type(decoder.norm), type(decoder.rotary_emb)


class MtpInput(nn.Module):
    """[enorm(e) ; hnorm(h)] -> D: DeepSeek's enorm/hnorm/eh_proj, Qwen3-Next's pre_fc_norms and fc."""

    def __init__(self, dim: int, norm: type, eps: float):
        super().__init__()
        self.enorm, self.hnorm = norm(dim, eps=eps), norm(dim, eps=eps)
        self.proj = nn.Linear(2 * dim, dim, bias=False)

    def forward(self, emb: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """emb, h: (B, Q, D) -> (B, Q, D)."""
        return self.proj(torch.cat([self.enorm(emb), self.hnorm(h)], dim=-1))


class SharedCache:
    """The transformers cache protocol (`update(k, v, layer_idx)`) over the chain's cache, every
    MTP layer writing the same entries: one position, one cache entry, whichever layer read it."""

    def __init__(self, cache: Any):
        self.cache = cache

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int = 0, *args, **kwargs):
        return self.cache.append(0, k, v)


class MtpDraft(nn.Module):
    confidence = None  # no confidence head: a served round verifies its whole chain
    drafting = "chain"  # served by the chain drafters (speculative/eagle3_chain.py)

    def __init__(self, arch: MtpArch):
        super().__init__()
        self.arch = a = arch
        config = block_config(arch)
        layer_cls, norm_cls, rotary_cls = target_classes(config)
        eps = float(getattr(config, "rms_norm_eps", 1e-6))
        d, k = a.hidden_size, a.num_mtp_layers
        # Frozen: the target's embedding, lm_head and final norm (`load_shared`, `init_from_target`).
        self.embed_tokens = nn.Embedding(a.vocab_size, d)
        self.target_lm_head = nn.Linear(d, a.vocab_size, bias=False)
        self.target_norm = norm_cls(d, eps=eps)
        # Trained, initialised from the target's MTP weights.
        shared = 1 if a.style == "mtp" else k  # Qwen3-Next: one fc and norm pair for its K layers
        self.heads = nn.ModuleList(MtpInput(d, norm_cls, eps) for _ in range(shared))
        self.blocks = nn.ModuleList(layer_cls(config, i) for i in range(k))
        self.out_norms = nn.ModuleList(norm_cls(d, eps=eps) for _ in range(shared))
        self.rotary = rotary_cls(config=config)
        params = inspect.signature(layer_cls.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.register_buffer("d2t", torch.zeros(a.vocab_size, dtype=torch.long))  # the identity map
        self.register_buffer("t2d", torch.ones(a.vocab_size, dtype=torch.bool))
        for frozen in (self.embed_tokens, self.target_lm_head, self.target_norm):
            frozen.requires_grad_(False)

    @property
    def vocab(self) -> VocabMap:
        return VocabMap(self.d2t, self.t2d)

    @torch.no_grad()
    def load_shared(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> None:
        """Copy the target's embedding and lm_head (both (V, D))."""
        for name, w, slot in (("embedding", embed_weight, self.embed_tokens),
                              ("lm_head", lm_head_weight, self.target_lm_head)):
            if tuple(w.shape) != tuple(slot.weight.shape):
                raise ValueError(f"target {name} has shape {tuple(w.shape)}, draft expects {tuple(slot.weight.shape)}")
            slot.weight.copy_(w.to(slot.weight.dtype))

    @torch.no_grad()
    def init_from_target(self, target: Any) -> None:
        """Start from the target's own MTP weights and final norm (target.mtp_state: the target's
        checkpoint read by target/mtp_weights.py); a checkpoint without them is refused there."""
        state = target.mtp_state(self.arch)
        missing, unexpected = self.load_state_dict(state, strict=False)
        missing = [m for m in missing if not m.startswith(("embed_tokens.", "target_lm_head.", "d2t", "t2d"))]
        if missing or unexpected:
            raise ValueError(f"the target's MTP weights do not fit the draft: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Everything but the embedding and lm_head (the frozen final-norm copy is small and kept)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith(("embed_tokens.", "target_lm_head."))}

    # ---- the chain draft's interface (models/eagle3.py) --------------------------------------

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """aux: (B, T, D) the target's last layer -> h: (B, T, D) after its final norm."""
        return self.target_norm(aux.to(self.target_lm_head.weight.dtype))

    def backbone(self, hidden: torch.Tensor, token_ids: torch.Tensor, positions: torch.Tensor, cache: Any,
                 mask: torch.Tensor | None = None, step: int = 0) -> torch.Tensor:
        """hidden: (B, Q, D) target states (`fuse`d) or the previous step's; token_ids, positions:
        (B, Q); mask: (B or 1, 1, Q, S+Q) bool, None: `chunk_mask`; step j reads with MTP layer
        j mod K -> o: (B, Q, D) after out_norm (what the next step reads). Appends Q positions."""
        if mask is None:
            mask = chunk_mask(token_ids.shape[1], cache.length, token_ids.device)
        k = step % self.arch.num_mtp_layers
        shared = k % len(self.heads)
        x = self.heads[shared](self.embed_tokens(token_ids), hidden)
        out = self.blocks[k](x, attention_mask=mask, position_ids=positions,
                             position_embeddings=self.rotary(x, positions), **{self._cache_kw: SharedCache(cache)})
        out = out[0] if isinstance(out, tuple) else out
        return self.out_norms[shared](out)

    def draft_logits(self, h: torch.Tensor) -> torch.Tensor:
        """h: (..., D) after out_norm -> (..., V) through the target's lm_head."""
        return self.target_lm_head(h)

    def target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        return draft_logits  # the draft vocabulary is the target's

    def unroll(self, aux: torch.Tensor, input_ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """The training-time test (Eagle3Draft.unroll): k states (B, U, D), step j with layer j mod K."""
        return unroll_chain(self, aux, input_ids, steps)
