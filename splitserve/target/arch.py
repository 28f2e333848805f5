"""What a target's config says about serving it exactly: per-layer attention windows, the
transform between lm_head and the logits, and a clear refusal for what cannot be served.

Everything here reads the HF config only (AutoConfig), so an unsupported target is refused at
start, before any weight is read.

Speculative decoding rewinds the target after every rejected draft token: the KV entries of the
rejected positions are dropped (reference loop) or masked out and overwritten (serving engine).
That is exact for attention, whose state is one entry per position. A recurrent layer (linear
attention, gated delta nets, KDA, Mamba-2) folds every token into one state, so its rewind
replays the accepted prefix through that layer's mixer (target/recurrent.py). Layer kinds with
no such rewind here (short-convolution-only layers, chunked attention) and models built
without per-layer kinds (pure SSMs, RWKV, xLSTM) are refused before any weight loads, naming
the kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

ATTENTION_KINDS = ("full_attention", "sliding_attention")
# Layer kinds with a recurrent state that target/recurrent.py rewinds (transformers' names):
# "linear_attention" covers gated DeltaNet, KDA and Mamba-2 layers; "hybrid" is Falcon-H1's
# attention and Mamba-2 side by side in one layer (full attention plus a recurrent mixer).
RECURRENT_KINDS = ("linear_attention", "mamba", "hybrid")
# Layers with neither attention nor a state (Nemotron-H's MLP and MoE blocks).
STATELESS_KINDS = ("mlp", "moe")
# Recurrent models whose configs list no layer kinds at all, and the kind of their layers.
# (Pure Mamba and Mamba-2 models declare linear_attention layer_types and are served like hybrids.)
RECURRENT_MODEL_TYPES = {"rwkv": "rwkv", "xlstm": "xlstm", "recurrent_gemma": "recurrent (RG-LRU)"}
# Bidirectional encoders that transformers can also build as a "causal LM" head (BertLMHeadModel,
# ...): every token attends to later ones in pretraining, and the layers are not a decoder's.
ENCODER_MODEL_TYPES = ("bert", "bert-generation", "roberta", "roberta-prelayernorm", "xlm-roberta", "xlm-roberta-xl",
                       "camembert", "data2vec-text", "electra", "ernie", "megatron-bert", "rembert", "xmod", "big_bird",
                       "modernbert", "deberta", "deberta-v2", "distilbert", "albert")
# transformers names both knobs `logits_scaling`; these models multiply by it where Granite divides.
MULTIPLY_LOGITS_SCALING = ("hyperclovax",)


class UnsupportedTargetError(ValueError):
    """The target's architecture cannot be served exactly by speculative decoding."""


def text_config(config: Any) -> Any:
    """The decoder's text config: the config itself, or the nested one of a multimodal model."""
    if not hasattr(config, "get_text_config"):
        return config
    try:
        return config.get_text_config(decoder=True)
    except TypeError:  # releases without the `decoder` keyword
        return config.get_text_config()


@dataclass(frozen=True)
class LogitTransform:
    """logits = softcap(lm_head(h) * multiplier / divisor), softcap(x) = c * tanh(x / c).

    Gemma-2/3 soft-cap (`final_logit_softcapping`), Granite divides by `logits_scaling`, Cohere
    multiplies by `logit_scale`. Verification at T > 0 samples from these logits, so leaving the
    transform out would target another distribution (greedy is unaffected: all are monotone).
    """

    multiplier: float = 1.0
    divisor: float = 1.0
    softcap: float | None = None

    @property
    def identity(self) -> bool:
        return self.multiplier == 1.0 and self.divisor == 1.0 and self.softcap is None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: (..., V) raw lm_head output -> (..., V) the target's own logits."""
        if self.multiplier != 1.0:
            logits = logits * self.multiplier
        if self.divisor != 1.0:
            logits = logits / self.divisor
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    @classmethod
    def from_config(cls, config: Any) -> LogitTransform:
        tc = text_config(config)
        softcap = getattr(tc, "final_logit_softcapping", None)
        scaling = float(getattr(tc, "logits_scaling", None) or 1.0)
        multiplier = float(getattr(tc, "logit_scale", None) or 1.0)
        divisor = scaling
        if getattr(tc, "model_type", "") in MULTIPLY_LOGITS_SCALING:
            multiplier, divisor = multiplier * scaling, 1.0
        return cls(multiplier=multiplier, divisor=divisor, softcap=float(softcap) if softcap else None)


@dataclass(frozen=True)
class AttentionLayout:
    """Per decoder layer: the sliding window W (a query at position q sees keys q-W+1..q) or
    None (all earlier keys). `layer_types` is the config's own list when it has one: the model
    then takes a dict of masks keyed by layer type (Gemma-2/3, Qwen2/3), else one mask for all
    layers (Mistral, Phi-3: every layer has the same window)."""

    windows: tuple[int | None, ...]
    layer_types: tuple[str, ...] | None
    recurrent: tuple[bool, ...] = ()  # per layer: holds a recurrent state (empty: none does)

    @property
    def windowed(self) -> bool:
        return any(w is not None for w in self.windows)

    @property
    def hybrid(self) -> bool:
        """Some layer keeps a recurrent state (its rewind is a replay, target/recurrent.py)."""
        return any(self.recurrent)

    @property
    def attention_free(self) -> bool:
        """No layer attends (a pure Mamba): its forward takes no attention mask at all."""
        return self.layer_types is not None and all(t not in ATTENTION_KINDS + ("hybrid",) for t in self.layer_types)

    def mask_keys(self) -> dict[str, int | None]:
        """layer type -> its window, for the dict-of-masks form (only when the windows differ)."""
        assert self.layer_types is not None
        return {t: w for t, w in zip(self.layer_types, self.windows)}


def _describe(config: Any) -> str:
    archs = getattr(config, "architectures", None) or []
    kind = getattr(config, "model_type", None) or type(config).__name__
    return f"{kind} ({', '.join(archs)})" if archs else str(kind)


def attention_layout(config: Any, where: str = "target") -> AttentionLayout:
    """config: a HF config (multimodal ones included) -> its AttentionLayout, or
    UnsupportedTargetError naming the architecture and the reason."""
    tc = text_config(config)
    name = _describe(config)
    model_type = getattr(tc, "model_type", "")
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedTargetError(f"{where}: {name} is an encoder-decoder model; speculative decoding here needs "
                                     "a decoder-only causal LM")
    if model_type in ENCODER_MODEL_TYPES:
        raise UnsupportedTargetError(f"{where}: {name} is a bidirectional encoder ({model_type}); speculative "
                                     "decoding here needs a decoder-only causal LM")
    pure = RECURRENT_MODEL_TYPES.get(model_type) or RECURRENT_MODEL_TYPES.get(getattr(config, "model_type", ""))
    if pure:
        raise UnsupportedTargetError(
            f"{where}: {name} is a purely recurrent model (every layer of kind {pure}, no per-layer kinds in its "
            "config); splitserve rewinds the recurrent layers of hybrid models that declare them in layer_types "
            "(linear_attention, hybrid), so it is refused")
    n = int(tc.num_hidden_layers)
    types = getattr(tc, "layer_types", None)
    window = getattr(tc, "sliding_window", None)
    if types is None:
        if getattr(tc, "attention_chunk_size", None) is not None:
            types = ["chunked_attention"] * n
        else:
            # Mistral, Phi-3, Qwen3-MoE: one optional window for every layer.
            return AttentionLayout(windows=(int(window) if window is not None else None,) * n, layer_types=None)
    types = list(types)
    known = ATTENTION_KINDS + RECURRENT_KINDS + STATELESS_KINDS
    other = sorted({t for t in types if t not in known})
    if other:
        raise UnsupportedTargetError(f"{where}: {name} has layers of kind {', '.join(other)}; splitserve serves "
                                     f"layers of kind {', '.join(known)}")
    if len(types) != n:
        raise UnsupportedTargetError(f"{where}: {name} lists {len(types)} layer_types for {n} layers")
    if "sliding_attention" in types and not window:
        raise UnsupportedTargetError(f"{where}: {name} has sliding_attention layers but no sliding_window")
    windows = tuple(int(window) if t == "sliding_attention" else None for t in types)
    recurrent = tuple(t in RECURRENT_KINDS for t in types)
    return AttentionLayout(windows=windows, layer_types=tuple(types), recurrent=recurrent if any(recurrent) else ())
