"""The native decoder: the target's forward over a static KV cache, written for batch-1 decode.

Same maths as the transformers forward of a Llama-family target (target/native/support.py),
organised for a step that reads every weight once:

    r = embed(ids)                                         (T, D), the residual stream
    per layer i:
        qkv  = rms_norm(r, ln1) @ W_qkv.T (+ b)            (T, (Hq + 2 Hkv) hd), one product
        q, k = rope(q_norm(q)), rope(k_norm(k))            (T, Hq, hd), (T, Hkv, hd)
        cache[i][:, positions] = k, v                      written in place, no copy of the cache
        a    = attention(q, cache[i], positions, W)        (T, Hq, hd): slots < W, j <= position
        r    = r + a @ W_o.T
        r    = r + silu(g) * u @ W_down.T,  [g | u] = rms_norm(r, ln2) @ W_gate_up.T   one (2F, D) product
    h = rms_norm(r, norm)                                  the decoder's output

r after layer i is what the draft's KV injection captures, so captures cost no extra pass. Each
step has fixed shapes, so a CUDA graph holds it whole. Two ways to run a layer:
  fused   every product is the Triton weight product with its neighbours folded in
          (linear_kernel.py): the norm before q|k|v and gate|up, SiLU·up after gate|up, the
          residual add after o and down. Six or seven launches a layer: four products, RoPE
          with the cache write, attention (and its merge of splits). On Hopper every Triton
          kernel is launched with PDL, so each one's prologue and first weight loads overlap
          the kernel before it.
  cublas  cuBLAS products with the residual add and RMSNorm in one kernel and SiLU·up in another
          (pointwise_kernel.py): nine or ten launches a layer.
`products` picks by the number of tokens (FUSED_MAX_T): "fused" (the default) runs the decode step
(T = 1) fused and longer forwards on cuBLAS, "triton" every forward of up to 32 tokens fused,
"cublas" none.
Either way the kernels run on a GPU and their PyTorch references elsewhere, in the same order and
roundings (pointwise.py, attention.py, linear.py); FP8 weights always take the Triton product.
Glossary: T new tokens, D hidden, Hq/Hkv heads, hd head dim, F FFN size, L cache slots,
W attention window, m captured layers.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from splitserve.target.native import attention_kernel, linear_kernel
from splitserve.target.native.pointwise_kernel import add_rms_norm, rms_norm, rope_and_write, silu_mul
from splitserve.target.native.weights import Layer, Linear

# Up to how many tokens a forward runs the fused layer, per `products` setting; longer ones (a
# verify block, a prefill) run the cuBLAS layer. On an H200 the fused T = 1 layer beats cuBLAS
# (its products stream at 80-92% of the copy bandwidth, PDL hides the launches); at T = 17 the
# Triton products come within 6% of cuBLAS's, but a whole verify on them is not measured yet, so
# "fused" keeps cuBLAS there (docs/results/engine_h200.md).
FUSED_MAX_T = {"fused": 1, "triton": 32, "cublas": 0}
PRODUCTS = tuple(FUSED_MAX_T)


class NativeKVCache:
    """k, v: (layers, Hkv, L, hd) preallocated; the caller says where each forward writes.
    cos, sin: (L, hd) the rotary tables of slots 0..L-1, which a forward's RoPE kernel reads at
    its positions (one table lookup, not the rotary module's 8-10 small kernels every forward)."""

    def __init__(self, num_layers: int, num_kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, rope: tuple[torch.Tensor, torch.Tensor]):
        self.max_len = max_len
        shape = (num_layers, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.cos, self.sin = rope

    def reset(self) -> None:
        """A new sequence needs nothing: slots at or above its positions stay masked until written."""


class NativeDecoder:
    def __init__(self, layers: list[Layer], embed: torch.Tensor, final_norm: torch.Tensor, rotary: Any, *,
                 num_heads: int, num_kv_heads: int, head_dim: int, eps: float, scale: float,
                 capture_ids: tuple[int, ...], products: str = "fused"):
        if products not in PRODUCTS:
            raise ValueError(f"products must be one of {PRODUCTS}, got {products!r}")
        self.layers, self.embed, self.final_norm, self.rotary = layers, embed, final_norm, rotary
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.eps, self.scale = eps, scale
        self.capture_ids = tuple(capture_ids)
        self.products = products

    def new_cache(self, max_len: int) -> NativeKVCache:
        # The rotary module's own values at every slot: its frequencies do not depend on the
        # sequence (target/native/support.py admits static rope types only), and each angle is
        # one float32 product of a frequency and a position, the same in a table as in a forward.
        positions = torch.arange(max_len, device=self.embed.device)[None]  # (1, L)
        cos, sin = self.rotary(self.embed[None, :1], positions)  # (1, L, hd) each, in the model's dtype
        return NativeKVCache(len(self.layers), self.num_kv_heads, max_len, self.head_dim, self.embed.dtype,
                             self.embed.device, (cos[0].contiguous(), sin[0].contiguous()))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: NativeKVCache,
                window: int) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids, positions: (T,) -> decoder output (T, D), captured layers (T, m*D)."""
        x = F.embedding(input_ids, self.embed)  # (T, D)
        slots = (positions, cache, window)  # where the layers' attention reads and writes
        run = self._fused if input_ids.shape[0] <= FUSED_MAX_T[self.products] else self._cublas
        h, captured = run(x, slots)
        aux = torch.cat([captured[i] for i in self.capture_ids], dim=-1)  # (T, m*D)
        return h, aux

    def _fused(self, x: torch.Tensor, slots: tuple) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """x (T, D) embedded -> (output (T, D), {layer: residual stream after it}), four products a
        layer with the norms, SiLU·up and the residual adds folded in."""
        r, captured = x, {}
        for i, layer in enumerate(self.layers):
            qkv = self._product(r, layer.qkv, norm=layer.ln1)  # (T, (Hq + 2 Hkv) hd)
            a = self._attend(i, layer, qkv, *slots)  # (T, Hq*hd)
            r = self._product(a, layer.o, residual=r)  # (T, D)
            act = self._product(r, layer.gate_up, norm=layer.ln2, silu=True)  # (T, F)
            r = self._product(act, layer.down, residual=r)  # (T, D)
            if i in self.capture_ids:
                captured[i] = r
        return rms_norm(r, self.final_norm, self.eps), captured

    def _cublas(self, x: torch.Tensor, slots: tuple) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """The same with cuBLAS products (FP8 weights: the Triton product); a product's output x
        joins the residual stream in the add+norm kernel that follows it."""
        residual, captured = None, {}
        for i, layer in enumerate(self.layers):
            h, residual = add_rms_norm(x, residual, layer.ln1, self.eps)
            if i - 1 in self.capture_ids:
                captured[i - 1] = residual
            a = self._attend(i, layer, self._linear(h, layer.qkv), *slots)  # (T, Hq*hd)
            h, residual = add_rms_norm(self._linear(a, layer.o), residual, layer.ln2, self.eps)
            x = self._linear(silu_mul(self._linear(h, layer.gate_up)), layer.down)  # (T, 2F) -> (T, F) -> (T, D)
        h, residual = add_rms_norm(x, residual, self.final_norm, self.eps)
        if len(self.layers) - 1 in self.capture_ids:
            captured[len(self.layers) - 1] = residual
        return h, captured

    def _product(self, x: torch.Tensor, lin: Linear, norm: torch.Tensor | None = None,
                 residual: torch.Tensor | None = None, silu: bool = False) -> torch.Tensor:
        return linear_kernel.product(x, lin.w, lin.scale, lin.bias, norm_weight=norm, eps=self.eps,
                                     residual=residual, silu=silu)

    def _linear(self, x: torch.Tensor, lin: Linear) -> torch.Tensor:
        return linear_kernel.linear(x, lin.w, lin.scale, lin.bias)

    def _attend(self, i: int, layer: Layer, qkv: torch.Tensor, positions: torch.Tensor, cache: NativeKVCache,
                window: int) -> torch.Tensor:
        """qkv (T, (Hq + 2 Hkv) hd) -> attention output (T, Hq*hd); k, v rotated by the cache's
        rotary tables at `positions` and written into those cache slots."""
        T, Hq, hd = qkv.shape[0], self.num_heads, self.head_dim
        q = rope_and_write(qkv, cache.cos, cache.sin, layer.q_norm, layer.k_norm, self.eps, cache.k[i], cache.v[i],
                           positions, Hq)  # (T, Hq, hd)
        a = attention_kernel.decode_attention(q, cache.k[i], cache.v[i], positions, window, self.scale,
                                              layer.sliding_window)  # (T, Hq, hd)
        return a.reshape(T, Hq * hd)
