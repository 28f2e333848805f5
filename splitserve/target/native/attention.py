"""Attention of a few queries over the static KV cache: the plain-PyTorch reference.

Serving runs the target at batch 1 over a preallocated cache. A decode step has one query, a
speculative verify step γ+1 (consecutive positions p..p+γ), a prefill thousands. This module is
what runs on a CPU and for long inputs on a GPU; `attention_kernel.py` holds the Triton kernel for
the short case and the dispatcher between the two (same signature, same result; the kernel's
tests check it against this file).

Glossary: T queries, Hq query heads, Hkv kv heads, G = Hq / Hkv the group of query heads that
share one kv head (grouped-query attention, as in Llama / Qwen: query head h reads kv head h // G),
hd head dim, L cache slots, W window (the slots 0..W-1 that are read, W <= L).

Visibility: query i sees slot j iff j < W and j <= positions[i], and, with a sliding window S,
also j > positions[i] - S. Precondition: every query sees at least one slot, which holds whenever
0 <= positions[i] < W (slot positions[i] itself is visible); a query that sees nothing gets NaN.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Queries per SDPA call: the boolean mask (and the additive mask SDPA makes of it on a GPU) has
# G*T*W entries, so a prefill of thousands of tokens over a long window goes in chunks that
# keep it near this many entries.
MASK_ENTRIES = 1 << 26


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    positions: torch.Tensor,
    window: int,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """q (T, Hq, hd) any strides, k_cache / v_cache (Hkv, L, hd), positions (T,) int64 on q's
    device -> out (T, Hq, hd) in q.dtype. Reads slots 0..window-1 only; no host sync."""
    T, Hq, hd = q.shape
    Hkv = k_cache.shape[0]
    G = Hq // Hkv
    assert G * Hkv == Hq, (Hq, Hkv)
    assert 0 < window <= k_cache.shape[1], (window, k_cache.shape)
    k = k_cache[None, :, :window]  # (1, Hkv, W, hd)
    v = v_cache[None, :, :window]
    slots = torch.arange(window, device=q.device)  # (W,)
    chunk = max(1, MASK_ENTRIES // (G * window))
    outs = []
    for start in range(0, T, chunk):
        outs.append(_attend(q[start:start + chunk], k, v, positions[start:start + chunk], slots, G, scale,
                            sliding_window))
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def _attend(q, k, v, positions, slots, G, scale, sliding_window):
    T, Hq, hd = q.shape
    Hkv = Hq // G
    # The G heads of a group become G*T rows of one kv head (row g*T + t), so SDPA reads each kv
    # head once instead of a K/V repeated G times.
    qf = q.unflatten(1, (Hkv, G)).permute(1, 2, 0, 3).reshape(1, Hkv, G * T, hd)  # (1, Hkv, G*T, hd)
    pos = positions[:, None]  # (T, 1)
    visible = slots <= pos  # (T, W)
    if sliding_window is not None:
        visible &= slots > pos - sliding_window
    mask = visible.repeat(G, 1)[None, None]  # (1, 1, G*T, W)
    out = F.scaled_dot_product_attention(qf, k, v, attn_mask=mask, scale=scale)  # (1, Hkv, G*T, hd)
    return out.view(Hkv, G, T, hd).permute(2, 0, 1, 3).reshape(T, Hq, hd)
