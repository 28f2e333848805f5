"""The native decoder: the target's forward over a static KV cache, written for batch-1 decode.

Same maths as the transformers forward of a Llama-family target (target/native/support.py),
organised for a step that reads every weight once:

    x = embed(ids)                                         (T, D)
    per layer i:
        h, r  = add_rms_norm(x, r, ln1)                    h (T, D); r the residual stream
        qkv   = h @ W_qkv.T (+ b)                          (T, (Hq + 2 Hkv) hd), one product
        q, k  = rope(q_norm(q)), rope(k_norm(k))           (T, Hq, hd), (T, Hkv, hd)
        cache[i][:, positions] = k, v                      written in place, no copy of the cache
        a     = attention(q, cache[i], positions, W)       (T, Hq, hd): slots < W, j <= position
        x     = a @ W_o.T
        h, r  = add_rms_norm(x, r, ln2)
        x     = silu(g) * u @ W_down.T, [g | u] = h @ W_gate_up.T   one (2F, D) product
    h, r = add_rms_norm(x, r, norm)                        h: the decoder's output

The residual stream after layer i is r as the next add produces it, so the captured layers
(the draft's KV injection) cost no extra pass. A layer is nine or ten launches: two norms, four
products, RoPE with the cache write, attention (and its merge of splits), SiLU-mul. Each step has
fixed shapes, so a CUDA graph holds it whole. The kernels dispatch to Triton on a GPU and to
their PyTorch references elsewhere (pointwise*.py, attention*.py, linear*.py); the bf16 products
are cuBLAS's unless `triton_linear` asks for the Triton one, which FP8 weights always use.
Glossary: T new tokens, D hidden, Hq/Hkv heads, hd head dim, F FFN size, L cache slots,
W attention window, m captured layers.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from splitserve.target.native import attention_kernel, linear_kernel
from splitserve.target.native.pointwise_kernel import add_rms_norm, rope_and_write, silu_mul
from splitserve.target.native.weights import Layer, Linear


class NativeKVCache:
    """k, v: (layers, Hkv, L, hd) preallocated; the caller says where each forward writes."""

    def __init__(self, num_layers: int, num_kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device):
        self.max_len = max_len
        shape = (num_layers, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)


class NativeDecoder:
    def __init__(self, layers: list[Layer], embed: torch.Tensor, final_norm: torch.Tensor, rotary: Any, *,
                 num_heads: int, num_kv_heads: int, head_dim: int, eps: float, scale: float,
                 capture_ids: tuple[int, ...], triton_linear: bool = False):
        self.layers, self.embed, self.final_norm, self.rotary = layers, embed, final_norm, rotary
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.eps, self.scale = eps, scale
        self.capture_ids = tuple(capture_ids)
        self.triton_linear = triton_linear

    def new_cache(self, max_len: int) -> NativeKVCache:
        return NativeKVCache(len(self.layers), self.num_kv_heads, max_len, self.head_dim, self.embed.dtype,
                             self.embed.device)

    def _linear(self, x: torch.Tensor, lin: Linear) -> torch.Tensor:
        return linear_kernel.linear(x, lin.w, lin.scale, lin.bias, prefer_triton=self.triton_linear)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: NativeKVCache,
                window: int) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids, positions: (T,) -> decoder output (T, D), captured layers (T, m*D)."""
        T = input_ids.shape[0]
        Hq, hd = self.num_heads, self.head_dim
        x = F.embedding(input_ids, self.embed)  # (T, D)
        cos, sin = self.rotary(x[None], positions[None])  # (1, T, hd) each, in x.dtype
        cos, sin = cos[0], sin[0]
        captured: dict[int, torch.Tensor] = {}
        residual = None
        for i, layer in enumerate(self.layers):
            h, residual = add_rms_norm(x, residual, layer.ln1, self.eps)
            if i - 1 in self.capture_ids:
                captured[i - 1] = residual
            qkv = self._linear(h, layer.qkv)  # (T, (Hq + 2 Hkv) hd)
            q = rope_and_write(qkv, cos, sin, layer.q_norm, layer.k_norm, self.eps, cache.k[i], cache.v[i],
                               positions, Hq)  # (T, Hq, hd); k, v now in cache slots `positions`
            a = attention_kernel.decode_attention(q, cache.k[i], cache.v[i], positions, window, self.scale,
                                                  layer.sliding_window)  # (T, Hq, hd)
            x = self._linear(a.reshape(T, Hq * hd), layer.o)  # (T, D)
            h, residual = add_rms_norm(x, residual, layer.ln2, self.eps)
            x = self._linear(silu_mul(self._linear(h, layer.gate_up)), layer.down)  # (T, 2F) -> (T, F) -> (T, D)
        h, residual = add_rms_norm(x, residual, self.final_norm, self.eps)
        last = len(self.layers) - 1
        if last in self.capture_ids:
            captured[last] = residual
        aux = torch.cat([captured[i] for i in self.capture_ids], dim=-1)  # (T, m*D)
        return h, aux
