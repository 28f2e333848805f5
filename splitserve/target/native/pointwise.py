"""The elementwise parts of a decoder layer, in plain PyTorch: the reference for
pointwise_kernel.py, and what runs on a CPU.

    add_rms_norm    residual' = x + residual (in the model's dtype, as transformers adds);
                    out = w * rmsnorm(residual') (statistics in float32, cast back before w)
    rope_and_write  q, k = rope(q_norm(q)), rope(k_norm(k)) from the packed q|k|v product; k and v
                    written into this layer's cache slots at `positions`
    silu_mul        silu(gate) * up from the packed gate|up product

In transformers each is several kernels that read and write the whole tensor (the residual
stream three times per norm); each here is one kernel on a GPU. The rounding follows
transformers' modules step by step, so in float32 the native decoder and the transformers
forward agree to rounding.
Glossary: T tokens, D hidden, Hq/Hkv heads, hd head dim, F FFN size, L cache slots.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: (..., D), weight (D,) -> (..., D) in x.dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual: (T, D) (residual None at the first layer) -> (normed (T, D), x + residual)."""
    summed = x if residual is None else residual + x
    return rms_norm(summed, weight, eps), summed


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (T, H, hd), cos/sin (T, hd) -> x rotated by its position (the half-split RoPE layout)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)  # (T, H, hd)
    return x * cos[:, None] + rotated * sin[:, None]


def rope_and_write(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_norm: torch.Tensor | None,
                   k_norm: torch.Tensor | None, eps: float, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   positions: torch.Tensor, num_heads: int) -> torch.Tensor:
    """qkv (T, (Hq + 2 Hkv) hd), cos/sin (L, hd) rotary tables of every slot, k_cache/v_cache
    (Hkv, L, hd) written at positions (T,) -> q (T, Hq, hd), normed (q_norm: per-head RMSNorm,
    Qwen3) and rotated by the tables' rows at positions."""
    Hkv, _, hd = k_cache.shape
    T, Hq = qkv.shape[0], num_heads
    cos, sin = cos[positions], sin[positions]  # (T, hd)
    q = qkv[:, : Hq * hd].view(T, Hq, hd)
    k = qkv[:, Hq * hd : (Hq + Hkv) * hd].view(T, Hkv, hd)
    v = qkv[:, (Hq + Hkv) * hd :].view(T, Hkv, hd)
    if q_norm is not None:
        q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    k_cache.index_copy_(1, positions, k.transpose(0, 1))  # (Hkv, T, hd) into (Hkv, L, hd)
    v_cache.index_copy_(1, positions, v.transpose(0, 1))
    return q


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up (T, 2F): [gate | up] -> silu(gate) * up (T, F)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
