"""Building blocks of the draft backbone: RMSNorm, RoPE, KV-injected attention, SwiGLU MLP.

Glossary: B batch, Q query (block) positions, C context positions, D hidden, H heads,
Hkv key/value heads, hd head dim.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

# Attention of a few queries over a static cache, as the serving layer supplies it (a split-KV
# kernel on CUDA, its PyTorch reference elsewhere): q (Q, Hq, hd), k_cache / v_cache (Hkv, L, hd),
# positions (Q,), window, scale -> (Q, Hq, hd); query i reads slots j <= positions[i], j < window.
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, float], torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 like the HF targets do, then cast back.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * xf).to(x.dtype)


class Rotary(nn.Module):
    """Rotary position embedding for arbitrary (non-contiguous) positions."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim, self.theta = head_dim, theta

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: (B, L) -> cos, sin: (B, 1, L, hd), broadcast over heads.
        # inv_freq is recomputed (hd/2 values) rather than kept as a buffer, so the module has
        # no state that meta-device construction or dtype casts could corrupt.
        exponent = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=positions.device) / self.head_dim
        inv_freq = 1.0 / (self.theta**exponent)
        freqs = positions.float()[..., None] * inv_freq  # (B, L, hd/2)
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos()[:, None], emb.sin()[:, None]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (B, H, L, hd)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class InjectedAttention(nn.Module):
    """Self-attention over the block whose keys/values are prefixed by the target's context.

    Keys are [W_K H_ctx ; W_K h_block] and values [W_V H_ctx ; W_V h_block]: the same
    projections and k-norm serve both parts, so context K/V depend only on H_ctx and can be
    cached across rounds (`project_context`).
    """

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, eps: float):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.q_proj = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * head_dim, dim, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def _kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        # x: (B, L, D) -> k, v: (B, Hkv, L, hd)
        b, length, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, length, self.n_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, length, self.n_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rotary(k, cos, sin), v

    def project_context(self, h_ctx: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """h_ctx: (B, C, D) -> (k, v), each (B, Hkv, C, hd)."""
        return self._kv(h_ctx, cos, sin)

    def forward(
        self,
        x: torch.Tensor,
        ctx_k: torch.Tensor,
        ctx_v: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """x: (B, Q, D); ctx_k/v: (B, Hkv, C, hd); mask: (B, 1, Q, C+Q) bool or None -> (B, Q, D)."""
        b, q_len, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, q_len, self.n_heads, self.head_dim)).transpose(1, 2)
        q = apply_rotary(q, cos, sin)
        k_blk, v_blk = self._kv(x, cos, sin)
        k = torch.cat([ctx_k, k_blk], dim=2)  # (B, Hkv, C+Q, hd)
        v = torch.cat([ctx_v, v_blk], dim=2)
        if mask is not None and self.training and self.n_heads != self.n_kv_heads:
            # Training: with a mask, CUDA's SDPA serves grouped K/V only through its math kernel,
            # which keeps fp32 scores of (B, H, Q, C+Q) per layer for backward (16 GiB at 8K context
            # and 512 anchors). Repeated K/V ((B, H, C+Q, hd), small) reach the memory-efficient one.
            rep = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:  # serving and evaluation: no extra copies (the round is launch-bound)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))

    def forward_cached(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                       cos: torch.Tensor, sin: torch.Tensor, window: int, attend: Attend) -> torch.Tensor:
        """Serving at batch 1, the same attention as `forward` without concatenating the context:
        the block's K/V are written into the context cache at the block's own slots, and every
        query reads slots 0..slots[-1] (the committed context, then the whole block) through
        `attend`. x: (1, Q, D); k_cache / v_cache: (1, Hkv, L, hd), context at slots < slots[0];
        slots: (Q,) consecutive, slots[-1] < window -> (1, Q, D)."""
        q_len = x.shape[1]
        q = self.q_norm(self.q_proj(x).view(1, q_len, self.n_heads, self.head_dim)).transpose(1, 2)
        q = apply_rotary(q, cos, sin)[0].transpose(0, 1)  # (Q, Hq, hd)
        k_blk, v_blk = self._kv(x, cos, sin)  # (1, Hkv, Q, hd)
        k_cache.index_copy_(2, slots, k_blk.to(k_cache.dtype))
        v_cache.index_copy_(2, slots, v_blk.to(v_cache.dtype))
        last = slots[-1:].expand(q_len)  # (Q,): the block sees itself whole
        out = attend(q, k_cache[0], v_cache[0], last, window, self.head_dim ** -0.5)  # (Q, Hq, hd)
        return self.o_proj(out.reshape(1, q_len, -1))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """Pre-norm decoder layer; the context enters only through attention's keys and values."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, ffn: int, eps: float):
        super().__init__()
        self.input_layernorm = RMSNorm(dim, eps)
        self.self_attn = InjectedAttention(dim, n_heads, n_kv_heads, head_dim, eps)
        self.post_attention_layernorm = RMSNorm(dim, eps)
        self.mlp = SwiGLU(dim, ffn)

    def forward(self, x, ctx_k, ctx_v, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), ctx_k, ctx_v, cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_cached(self, x, k_cache, v_cache, slots, cos, sin, window: int, attend: Attend):
        x = x + self.self_attn.forward_cached(self.input_layernorm(x), k_cache, v_cache, slots, cos, sin, window,
                                              attend)
        return x + self.mlp(self.post_attention_layernorm(x))
