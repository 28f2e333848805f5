"""Which targets the native decoder serves, decided from the config alone (no weights read).

The native decoder (target/native/decoder.py) re-implements one layer family: pre-norm
RMSNorm blocks with rotary attention (grouped K/V, optional q/k biases, optional per-head q/k
RMSNorm) and a SwiGLU MLP. Llama, Mistral, Qwen2 and Qwen3 (and the models that reuse their
classes, SmolLM2 among them) are that family. Anything else keeps the transformers forward,
which the engine then uses unchanged: `native_reason` says why, in one line.
"""

from __future__ import annotations

from typing import Any

from splitserve.target.arch import text_config

# the model types of the family (Qwen3's per-head q/k RMSNorm is read from its modules)
FAMILY = ("llama", "mistral", "qwen2", "qwen3")
# rope types whose frequencies and scaling do not depend on the sequence length, so one table
# computed at load time is the one transformers would use at every position
STATIC_ROPE = ("default", "linear", "llama3", "yarn")


def rope_type(tc: Any) -> str:
    params = getattr(tc, "rope_parameters", None) or getattr(tc, "rope_scaling", None) or {}
    return str(params.get("rope_type", params.get("type", "default")))


def native_reason(config: Any) -> str | None:
    """None when the native decoder reproduces this target's forward, else why not."""
    tc = text_config(config)
    kind = getattr(tc, "model_type", "")
    if kind not in FAMILY:
        return f"model_type {kind!r} is not one of the native family ({', '.join(FAMILY)})"
    if getattr(tc, "hidden_act", "silu") != "silu":
        return f"hidden_act {tc.hidden_act!r} (the native MLP is SwiGLU)"
    if getattr(tc, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1 splits the projections differently"
    if getattr(tc, "mlp_bias", False):
        return "mlp_bias (the native MLP has no biases)"
    if rope_type(tc) not in STATIC_ROPE:
        return f"rope type {rope_type(tc)!r} changes with the sequence length"
    return None


PROJECTIONS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}


def modules_reason(layers: Any, dtype: Any) -> str | None:
    """None when every projection of every layer is a plain nn.Linear holding `dtype` weights;
    else why not (a quantised or adapter-wrapped model: packing its weights would be wrong)."""
    from torch import nn

    for i, layer in enumerate(layers):
        for block, names in PROJECTIONS.items():
            for name in names:
                mod = getattr(getattr(layer, block, None), name, None)
                if type(mod) is not nn.Linear:
                    return f"layer {i} {block}.{name} is {type(mod).__name__}, not a plain nn.Linear"
                if mod.weight.dtype != dtype:
                    return f"layer {i} {block}.{name} holds {mod.weight.dtype} weights in a {dtype} model"
    return None
