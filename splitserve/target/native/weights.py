"""The target's layer weights packed for batch-1 decode: one matrix for q/k/v, one for gate/up.

At batch 1 a decode step reads every weight once and does little else, so the number and size
of the matrix products matter more than their FLOPs: one (q|k|v) product instead of three and
one (gate|up) instead of two give 5 products per layer, not 7, each larger. The packed tensors
are new storage; the transformers modules' own parameters are then re-pointed at views of it,
so the target is held once in memory and its transformers forward (captures, `generate`) keeps
working on the very same numbers.

`weight_format="fp8"` adds a weight-only FP8 (e4m3) copy of every layer product, one scale per
output row (target/native/linear.py): half the bytes per step, and not lossless against the
model's own dtype. The lm_head stays in the model's dtype: it is shared with the draft.
Glossary: D hidden, Hq/Hkv query/key-value heads, hd head dim, F intermediate (FFN) size.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from splitserve.target.native.linear import quantize_fp8

WEIGHT_FORMATS = ("model", "fp8")


@dataclass
class Linear:
    """One product y = x @ w.T (+ bias): w (N, K) in the model's dtype or float8_e4m3fn with
    scale (N,) float32 per output row."""

    w: torch.Tensor
    scale: torch.Tensor | None = None
    bias: torch.Tensor | None = None


@dataclass
class Layer:
    ln1: torch.Tensor  # (D,) input RMSNorm weight
    qkv: Linear  # (Hq*hd + 2*Hkv*hd, D)
    q_norm: torch.Tensor | None  # (hd,) per-head RMSNorm (Qwen3), else None
    k_norm: torch.Tensor | None
    o: Linear  # (D, Hq*hd)
    ln2: torch.Tensor  # (D,)
    gate_up: Linear  # (2F, D): rows 0..F-1 gate, F..2F-1 up
    down: Linear  # (D, F)
    sliding_window: int | None  # this layer's own window, from target/arch.py


def _pack(modules: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the rows of `modules` into new storage and re-point each module's weight (and
    bias) at its rows of it: (sum N_i, K), (sum N_i,) | None."""
    weight = torch.cat([m.weight.detach() for m in modules])
    has_bias = [m.bias is not None for m in modules]
    if any(has_bias) and not all(has_bias):
        raise ValueError("a packed product needs a bias on all of its parts or on none")
    bias = torch.cat([m.bias.detach() for m in modules]) if all(has_bias) else None
    row = 0
    for m in modules:
        n = m.weight.shape[0]
        m.weight = nn.Parameter(weight[row : row + n], requires_grad=False)
        if bias is not None:
            m.bias = nn.Parameter(bias[row : row + n], requires_grad=False)
        row += n
    return weight, bias


def _plain(m: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    return m.weight.detach(), None if m.bias is None else m.bias.detach()


def _model(weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
    return Linear(weight, None, bias)


def pack_layers(layers: nn.ModuleList, windows: tuple[int | None, ...]) -> list[Layer]:
    """transformers decoder layers (Llama/Mistral/Qwen2/Qwen3 modules) -> packed Layers in the
    model's own dtype. Re-points the modules at the packed storage, so do it once per model."""
    out = []
    for layer, window in zip(layers, windows):
        attn, mlp = layer.self_attn, layer.mlp
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        out.append(Layer(
            ln1=layer.input_layernorm.weight.detach(),
            qkv=_model(*_pack([attn.q_proj, attn.k_proj, attn.v_proj])),
            q_norm=None if q_norm is None else q_norm.weight.detach(),
            k_norm=None if k_norm is None else k_norm.weight.detach(),
            o=_model(*_plain(attn.o_proj)),
            ln2=layer.post_attention_layernorm.weight.detach(),
            gate_up=_model(*_pack([mlp.gate_proj, mlp.up_proj])),
            down=_model(*_plain(mlp.down_proj)),
            sliding_window=window,
        ))
    return out


def _fp8(lin: Linear) -> Linear:
    w8, scale = quantize_fp8(lin.w)
    return Linear(w8, scale, lin.bias)


def in_format(layers: list[Layer], weight_format: str) -> list[Layer]:
    """Packed layers with their four products in `weight_format`: the layers themselves for
    "model", new FP8 copies of the products (norms shared) for "fp8"."""
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"weight_format must be one of {WEIGHT_FORMATS}, got {weight_format!r}")
    if weight_format == "model":
        return layers
    return [replace(layer, qkv=_fp8(layer.qkv), o=_fp8(layer.o), gate_up=_fp8(layer.gate_up),
                    down=_fp8(layer.down)) for layer in layers]
