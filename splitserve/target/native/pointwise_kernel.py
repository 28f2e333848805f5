"""Triton kernels for the elementwise parts of a decoder layer: one launch each.

Same signatures and values as target/native/pointwise.py, the reference (tests/test_native_kernels.py
checks them, on CUDA or under TRITON_INTERPRET=1). The dispatchers below run Triton on CUDA tensors
when triton is importable, the reference otherwise, so the decoder never branches.

Each kernel reads its inputs once and writes its outputs once. The roundings to the model's dtype
sit where transformers rounds (after the residual add, after the normalisation, after SiLU); the
products between them are float32, which in bf16 may round a last bit differently from the
transformers forward, as any fused kernel does.
Glossary: T tokens, D hidden, Hq/Hkv heads, hd head dim, F FFN size, L cache slots.
"""

from __future__ import annotations

import torch

from splitserve.accel import HAS_TRITON, pdl_args, triton_op, triton_usable, wrap_triton
from splitserve.target.native import pointwise as reference

if HAS_TRITON:
    import triton
    import triton.language as tl

    from splitserve.accel import pdl_prologue_done


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x (T, D) -> w * rmsnorm(x) (T, D)."""
    if not triton_usable(x):
        return reference.rms_norm(x, weight, eps)
    return _rms_norm_op(x.contiguous(), weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual (T, D) -> (w * rmsnorm(x + residual) (T, D), x + residual (T, D))."""
    if not triton_usable(x):
        return reference.add_rms_norm(x, residual, weight, eps)
    if residual is None:  # the first layer: nothing to add, the stream is x itself
        return _rms_norm_op(x.contiguous(), weight, eps), x
    return _add_rms_norm_op(x.contiguous(), residual.contiguous(), weight, eps)


def rope_and_write(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_norm: torch.Tensor | None,
                   k_norm: torch.Tensor | None, eps: float, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   positions: torch.Tensor, num_heads: int) -> torch.Tensor:
    """qkv (T, (Hq + 2 Hkv) hd), cos/sin (L, hd) rotary tables read at positions (T,) -> q (T, Hq, hd);
    k, v written into k_cache/v_cache (Hkv, L, hd), each of any strides (written in place: no copy)."""
    if triton_usable(qkv) and _pow2(k_cache.shape[-1]):
        return _rope_and_write_op(qkv.contiguous(), cos.contiguous(), sin.contiguous(), q_norm, k_norm, eps,
                                  k_cache, v_cache, positions.contiguous(), num_heads)  # read as contiguous
    return reference.rope_and_write(qkv, cos, sin, q_norm, k_norm, eps, k_cache, v_cache, positions, num_heads)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up (T, 2F) -> silu(gate) * up (T, F)."""
    if triton_usable(gate_up):
        return _silu_mul_op(gate_up.contiguous())
    return reference.silu_mul(gate_up)


if HAS_TRITON:

    @triton.jit
    def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, sum_ptr, D, eps: tl.constexpr,
                             HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
        # One program per token row: the whole row fits one block (D <= 16K here).
        pdl_prologue_done(USE_PDL)
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        keep = offs < D
        x = tl.load(x_ptr + row * D + offs, mask=keep, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(r_ptr + row * D + offs, mask=keep, other=0.0)
            s = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # the residual stream is kept in the model's dtype
            tl.store(sum_ptr + row * D + offs, s, mask=keep)
        else:
            s = x
        h = s.to(tl.float32)
        inv = tl.rsqrt(tl.sum(h * h, 0) / D + eps)
        h = (h * inv).to(x.dtype).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=keep, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * D + offs, (h * w).to(out_ptr.dtype.element_ty), mask=keep)

    @triton.jit
    def _rope_and_write_kernel(qkv_ptr, cos_ptr, sin_ptr, qn_ptr, kn_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
                               pos_ptr, eps: tl.constexpr, skh, skl, skd, svh, svl, svd, Hq: tl.constexpr,
                               Hkv: tl.constexpr, HD: tl.constexpr, HAS_NORM: tl.constexpr, USE_PDL: tl.constexpr):
        # Program (t, h): head h < Hq is query head h; else key/value head h - Hq, written to the cache.
        pdl_prologue_done(USE_PDL)
        t, h = tl.program_id(0), tl.program_id(1)
        HALF: tl.constexpr = HD // 2
        offs = tl.arange(0, HALF)
        row = qkv_ptr + t * (Hq + 2 * Hkv) * HD
        is_q = h < Hq
        src = row + h * HD  # query heads, then key heads, in the packed product
        x1 = tl.load(src + offs).to(tl.float32)
        x2 = tl.load(src + HALF + offs).to(tl.float32)
        dtype = qkv_ptr.dtype.element_ty
        if HAS_NORM:  # per-head RMSNorm (Qwen3) before the rotation, rounded as transformers rounds
            inv = tl.rsqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / HD + eps)
            if is_q:
                w1, w2 = tl.load(qn_ptr + offs), tl.load(qn_ptr + HALF + offs)
            else:
                w1, w2 = tl.load(kn_ptr + offs), tl.load(kn_ptr + HALF + offs)
            x1 = ((x1 * inv).to(dtype).to(tl.float32) * w1.to(tl.float32)).to(dtype).to(tl.float32)
            x2 = ((x2 * inv).to(dtype).to(tl.float32) * w2.to(tl.float32)).to(dtype).to(tl.float32)
        pos = tl.load(pos_ptr + t)  # the token's slot: its row of the rotary tables and of the cache
        c1 = tl.load(cos_ptr + pos * HD + offs).to(tl.float32)
        c2 = tl.load(cos_ptr + pos * HD + HALF + offs).to(tl.float32)
        s1 = tl.load(sin_ptr + pos * HD + offs).to(tl.float32)
        s2 = tl.load(sin_ptr + pos * HD + HALF + offs).to(tl.float32)
        o1 = (x1 * c1 - x2 * s1).to(dtype)
        o2 = (x2 * c2 + x1 * s2).to(dtype)
        if is_q:
            dst = q_out_ptr + (t * Hq + h) * HD
            tl.store(dst + offs, o1)
            tl.store(dst + HALF + offs, o2)
        else:
            # each cache through its own strides, as decode_attention reads them: v need not be
            # laid out like k, nor hd be innermost (a stride of 1 compiles to the contiguous store)
            kh = h - Hq
            k_dst = k_cache_ptr + kh * skh + pos * skl
            tl.store(k_dst + offs * skd, o1)
            tl.store(k_dst + (HALF + offs) * skd, o2)
            v_src = row + (Hq + Hkv + kh) * HD
            v_dst = v_cache_ptr + kh * svh + pos * svl
            tl.store(v_dst + offs * svd, tl.load(v_src + offs))
            tl.store(v_dst + (HALF + offs) * svd, tl.load(v_src + HALF + offs))

    @triton.jit
    def _silu_mul_kernel(gu_ptr, out_ptr, F, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
        pdl_prologue_done(USE_PDL)
        t, blk = tl.program_id(0), tl.program_id(1)
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        keep = offs < F
        g = tl.load(gu_ptr + t * 2 * F + offs, mask=keep, other=0.0)
        u = tl.load(gu_ptr + t * 2 * F + F + offs, mask=keep, other=0.0).to(tl.float32)
        gf = g.to(tl.float32)
        act = (gf * tl.sigmoid(gf)).to(g.dtype).to(tl.float32)  # transformers rounds SiLU's output
        tl.store(out_ptr + t * F + offs, (act * u).to(g.dtype), mask=keep)

    def _norm_launch(x, residual, weight, eps, summed):
        T, D = x.shape
        out = torch.empty((T, D), dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
        wrap_triton(_add_rms_norm_kernel)[(T,)](x, x if residual is None else residual, weight, out, summed, D, eps,
                                                HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(D),
                                                **pdl_args(x))
        return out

    @triton_op("rms_norm")
    def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return _norm_launch(x, None, weight, eps, x)  # nothing is stored through the sum pointer

    @triton_op("add_rms_norm")
    def _add_rms_norm_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                         eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        summed = torch.empty_like(x)
        return _norm_launch(x, residual, weight, eps, summed), summed

    @triton_op("rope_and_write", mutates_args=("k_cache", "v_cache"))
    def _rope_and_write_op(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_norm: torch.Tensor | None,
                           k_norm: torch.Tensor | None, eps: float, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           positions: torch.Tensor, num_heads: int) -> torch.Tensor:
        Hkv, _, hd = k_cache.shape
        T = qkv.shape[0]
        q = torch.empty((T, num_heads, hd), dtype=qkv.dtype, device=qkv.device)
        norm = q_norm is not None
        wrap_triton(_rope_and_write_kernel)[(T, num_heads + Hkv)](
            qkv, cos, sin, q_norm if norm else qkv, k_norm if norm else qkv, q, k_cache, v_cache, positions, eps,
            *k_cache.stride(), *v_cache.stride(), Hq=num_heads, Hkv=Hkv, HD=hd, HAS_NORM=norm, **pdl_args(qkv),
        )
        return q

    @triton_op("silu_mul")
    def _silu_mul_op(gate_up: torch.Tensor) -> torch.Tensor:
        T, two_f = gate_up.shape
        F = two_f // 2
        out = torch.empty((T, F), dtype=gate_up.dtype, device=gate_up.device)
        block = min(1024, triton.next_power_of_2(F))
        wrap_triton(_silu_mul_kernel)[(T, triton.cdiv(F, block))](gate_up, out, F, BLOCK=block, **pdl_args(gate_up))
        return out
