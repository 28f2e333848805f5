"""Weight-only products for T <= 32 tokens in Triton: a GEMV / skinny GEMM that reads each weight
once, with the pieces of a decoder layer around it folded in.

The PyTorch reference is `splitserve/target/native/linear.py`; `linear` and `product` here have
its signatures and dispatch: the kernel on CUDA tensors when triton is importable and T <= 32 (a
decode step, or a verify step of γ+1 <= 17 tokens), the reference otherwise. tests/test_kernel_linear.py
checks they agree, on CUDA or under TRITON_INTERPRET=1.

Design: at these T a product is weight-read bound, so the grid is over tiles of BLOCK_N weight
rows; each program streams its rows over K once and keeps every one of the T rows of x (tiny,
served from L2) against them, accumulating in float32. The next K tile of weights is requested
before the current one is used (two tiles in flight per program), and the first one before the
program waits on the kernel before it (programmatic dependent launch, `USE_PDL`): weights are
never written by an earlier kernel, so a product's first loads overlap its predecessor's tail.
T = 1 multiplies the weight tile by the x row and sums over K once after the loop; T >= 2 pads
T to 16 or 32 and uses tl.dot (the padding costs tensor-core work only, which is idle here), with
the weight tile as the left operand (`swap_ab`: its 64 rows are the M of Hopper's warpgroup MMA,
fed from the compiler's pipelined shared-memory copies) and sums kept transposed.

What is folded in, each a compile-time switch (the reference's `product` is the composition):
  PRE_NORM  x is the residual stream: each program first takes every row's RMS over K (x is a
            few KB, from L2) and normalises x tile by tile, rounded where rms_norm rounds. The
            separate norm kernel and the normalised copy of x are gone. At T >= 2, where that
            pass costs more than the swapped product itself, `product` runs the RMSNorm kernel
            (pointwise_kernel.rms_norm) first instead and the product reads its output.
  SILU      w is [gate | up] (2F rows): a program owns gate rows n and up rows F + n and writes
            silu(gate) * up, never the (T, 2F) product.
  ADD       out = residual + product, the residual stream's add.
  fp8       the per-row scale multiplies each finished sum once; bias joins in the same epilogue.
When the N tiles alone are too few programs to keep the memory system busy (SmolLM2's o and down
projections), a second grid axis splits K, the programs write float32 partial sums and a small
kernel adds them and applies the epilogue. Block sizes come from `pick_config`, not autotune, so
the launch is the same under CUDA graph capture and torch.compile. The launcher is the custom op
`splitserve::weight_product` (torch.library.triton_op).
Glossary: T tokens (rows of x), K in features, N out features (F with SILU: the weight has 2F rows).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from splitserve.accel import HAS_TRITON, pdl_args, triton_op, triton_usable, wrap_triton
from splitserve.target.native import linear as reference
from splitserve.target.native.linear import check_args, check_product
from splitserve.target.native.pointwise_kernel import rms_norm

if HAS_TRITON:
    import triton
    import triton.language as tl

    from splitserve.accel import pdl_prologue_done

MAX_TRITON_T = 32
# Split-K when the N tiles alone leave SMs idle (fewer than one program per SM of an H200, 132),
# up to 2 programs per SM: a heuristic, so other GPUs just get a less tuned split.
SMS = 132
TARGET_PROGRAMS = 2 * SMS
GEMV_ELEMS = 8192  # bf16 weight elements of one program's K step at T = 1


class Config(NamedTuple):
    block_t: int
    block_n: int
    block_k: int
    split_k: int  # programs along K
    k_per_split: int  # a multiple of block_k, so splits never share a K step
    use_dot: bool
    num_warps: int = 4
    prefetch: bool = True  # the next weight tile in registers (and the first before the PDL wait)
    num_stages: int = 1  # the compiler's own pipelining, for prefetch=False
    reduce_each: bool = False  # T = 1: sum over K every step (one running sum per row) or once at the end
    block_ptr: bool = False  # T >= 2 without prefetch: weight tiles through block pointers
    swap_ab: bool = False  # T >= 2: out^T = w @ x^T, so the weight tile is the dot's M side (64+ rows)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _swapped(t: int, w_bytes: int) -> bool:
    """Whether pick_config gives this product the swapped dot: T >= 2 on 2-byte (bf16/fp16) or
    fp8 weights. On fp8 at T = 16 (an FP8 draft's block, 8B-class shapes, H100) it beat the
    earlier blocks on every product, 1.04-1.48x (docs/results/head_options_h100.md). float32
    weights keep the earlier T >= 2 blocks: the swapped dot was not measured on them."""
    return t > 1 and w_bytes in (1, 2)


def pick_config(t: int, n: int, k: int, w_bytes: int, silu: bool = False) -> Config:
    """Block sizes for x (t, k) against n output columns of w (n or 2n rows with silu), w_bytes
    bytes per weight (2 bf16, 1 fp8). At T = 1 a short K (<= 2048) is one step, so a program's
    whole tile is in flight before it waits on the kernel before it, and the row tile shrinks
    until the programs cover the SMs. At T >= 2 every program also reads all of x (from L2), so
    row tiles are wider and K steps shorter."""
    use_dot = t > 1
    warps, reduce_each = 4, False
    if _swapped(t, w_bytes):
        # the swapped dot, pipelined by the compiler, K split to fill the SMs (swept at T = 17: an
        # 8B-class layer's products in 1.06x cuBLAS's time without the norm, 1.9x before; `product`
        # normalises x before it)
        block_k = max(16, min(_pow2(k), 128))
        split, k_per_split = split_k(n, k, 64, block_k)
        return Config(max(16, _pow2(t)), 64, block_k, split, k_per_split, True, 4, prefetch=False, num_stages=3,
                      swap_ab=True)
    if use_dot:  # float32 weights: the blocks of the first T = 17 sweep
        block_t = max(16, _pow2(t))
        block_k = max(16, min(_pow2(k), 64))
        block_n, warps = 64, 8
    else:
        block_t = 1
        narrow = w_bytes < 2  # fp8: twice the weights per byte
        block_k = max(16, _pow2(k)) if k <= 2048 else (2048 if narrow else 1024)
        block_n = max(1, min(GEMV_ELEMS * (2 if narrow else 1) // block_k, 32) // (2 if silu else 1))
        if silu and k > 2048:  # gate|up of a large model: longer rows
            block_k, block_n = 2048, 4 if narrow else 2
        # one running sum per row where measured faster: gate|up of a large model, and fp8 (whose
        # conversions make the per-element sums cost registers the prefetch needs)
        reduce_each = narrow or (silu and k > 2048)
        while block_n > 2 and -(-n // block_n) < SMS:
            block_n //= 2
    split, k_per_split = split_k(n, k, block_n, block_k)
    return Config(block_t, block_n, block_k, split, k_per_split, use_dot, warps, reduce_each=reduce_each)


def split_k(n: int, k: int, block_n: int, block_k: int) -> tuple[int, int]:
    """-> (programs along K, K columns each, a multiple of block_k): a K split when the N tiles
    alone are fewer programs than SMs, up to TARGET_PROGRAMS in all."""
    n_tiles, k_steps = -(-n // block_n), -(-k // block_k)
    split = 1
    if n_tiles < SMS:
        # Each split keeps >= 2 K steps: one step per program would be all latency.
        split = max(1, min(-(-TARGET_PROGRAMS // n_tiles), k_steps // 2))
    steps_per_split = -(-k_steps // split)
    return -(-k_steps // steps_per_split), steps_per_split * block_k  # no empty split


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    prefer_triton: bool = False,
) -> torch.Tensor:
    """x (T, K), w (N, K) of x's dtype or fp8, scale (N,) fp32 iff fp8, bias (N,) -> y (T, N), x's
    dtype. The kernel for fp8 weights, or when asked (cuBLAS is the default for a plain product)."""
    if triton_usable(x) and x.shape[0] <= MAX_TRITON_T and (w.dtype == reference.FP8 or prefer_triton):
        return linear_triton(x, w, scale, bias)
    return reference.linear(x, w, scale, bias)


def product(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None, bias: torch.Tensor | None = None, *,
    norm_weight: torch.Tensor | None = None, eps: float = 0.0, residual: torch.Tensor | None = None,
    silu: bool = False,
) -> torch.Tensor:
    """`reference.product` (norm, product, SiLU·up, residual add), one kernel on CUDA for T <= 32
    (two with the swapped dot and a norm: the RMSNorm kernel, then the product)."""
    if triton_usable(x) and x.shape[0] <= MAX_TRITON_T:
        check_product(x, w, scale, bias, norm_weight, residual, silu)
        if norm_weight is not None and _swapped(x.shape[0], w.element_size()):
            # a pass over K in every program would cost more than the product (T = 17 sweep)
            x, norm_weight = rms_norm(x, norm_weight, eps), None
        return _op(x, w, scale, bias, norm_weight, residual, float(eps), silu)
    return reference.product(x, w, scale, bias, norm_weight=norm_weight, eps=eps, residual=residual, silu=silu)


def linear_triton(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The kernel for any T (the dispatchers keep it to T <= 32, the sizes it is built for): same contract."""
    check_args(x, w, scale, bias)
    return _op(x, w, scale, bias, None, None, 0.0, False)


if HAS_TRITON:

    @triton.jit
    def _epilogue(acc_a, acc_b, offs_t, offs_n, T, N, scale_ptr, bias_ptr, res_ptr, out_ptr,
                  HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, ADD: tl.constexpr):
        # acc_a (BLOCK_T, BLOCK_N) float32 sums over all of K for output columns offs_n (gate
        # rows with SILU; acc_b the up rows N + offs_n) -> out (T, N) rows offs_t, columns offs_n.
        n_in = offs_n < N
        dtype = out_ptr.dtype.element_ty
        if HAS_SCALE:
            acc_a = acc_a * tl.load(scale_ptr + offs_n, mask=n_in, other=0.0)[None, :]
        if HAS_BIAS:
            acc_a = acc_a + tl.load(bias_ptr + offs_n, mask=n_in, other=0.0).to(tl.float32)[None, :]
        y = acc_a.to(dtype)  # the product, rounded as the unfused product rounds its output
        if SILU:
            if HAS_SCALE:
                acc_b = acc_b * tl.load(scale_ptr + N + offs_n, mask=n_in, other=0.0)[None, :]
            if HAS_BIAS:
                acc_b = acc_b + tl.load(bias_ptr + N + offs_n, mask=n_in, other=0.0).to(tl.float32)[None, :]
            g = y.to(tl.float32)
            act = (g * tl.sigmoid(g)).to(dtype).to(tl.float32)  # transformers rounds SiLU's output
            y = (act * acc_b.to(dtype).to(tl.float32)).to(dtype)
        mask = (offs_t[:, None] < T) & n_in[None, :]
        if ADD:
            r = tl.load(res_ptr + offs_t[:, None] * N + offs_n[None, :], mask=mask, other=0.0)
            y = (y.to(tl.float32) + r.to(tl.float32)).to(dtype)
        tl.store(out_ptr + offs_t[:, None] * N + offs_n[None, :], y, mask=mask)

    @triton.jit
    def _product_kernel(x_ptr, w_ptr, scale_ptr, bias_ptr, norm_ptr, res_ptr, out_ptr,
                        T, N, K, stride_x, stride_w, k_per_split, eps,
                        BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        USE_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, PARTIAL: tl.constexpr,
                        HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, PRE_NORM: tl.constexpr,
                        SILU: tl.constexpr, ADD: tl.constexpr, USE_PDL: tl.constexpr, PREFETCH: tl.constexpr,
                        REDUCE_EACH: tl.constexpr, BLOCK_PTR: tl.constexpr, SWAP_AB: tl.constexpr):
        # Program (n, s): output columns offs_n over K range s. PARTIAL: float32 sums to
        # out (split, T, N or 2N) and the reduce kernel finishes.
        pid_n, pid_k = tl.program_id(0), tl.program_id(1)
        offs_t = tl.arange(0, BLOCK_T)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        t_in, n_in = offs_t < T, offs_n < N
        k_start = pid_k * k_per_split
        k_end = tl.minimum(k_start + k_per_split, K)
        rows_b = offs_n + N  # SILU: the up rows
        offs_k = k_start + tl.arange(0, BLOCK_K)
        k_ok = offs_k < k_end
        wa = tl.zeros((BLOCK_N, BLOCK_K), w_ptr.dtype.element_ty)
        wb = wa
        if PREFETCH:  # weights are read-only for the whole run: the first tile is on its way before waiting
            wa = tl.load(w_ptr + offs_n[:, None] * stride_w + offs_k[None, :], mask=n_in[:, None] & k_ok[None, :],
                         other=0.0)
            if SILU:
                wb = tl.load(w_ptr + rows_b[:, None] * stride_w + offs_k[None, :],
                             mask=n_in[:, None] & k_ok[None, :], other=0.0)
        pdl_prologue_done(USE_PDL)

        inv = tl.zeros([BLOCK_T], tl.float32)
        if PRE_NORM:  # every row's 1/RMS over all of K (x is small and stays in L2)
            ss = tl.zeros([BLOCK_T], tl.float32)
            for k0 in range(0, K, BLOCK_K):
                kk = k0 + tl.arange(0, BLOCK_K)
                xs = tl.load(x_ptr + offs_t[:, None] * stride_x + kk[None, :], mask=t_in[:, None] & (kk < K)[None, :],
                             other=0.0).to(tl.float32)
                ss += tl.sum(xs * xs, 1)
            inv = tl.rsqrt(ss / K + eps)

        if USE_DOT:
            # SWAP_AB: the sums are kept transposed, (BLOCK_N, BLOCK_T), so that the weight tile is
            # the left operand: its BLOCK_N rows are the M the tensor-core instructions want
            # (Hopper's warpgroup MMA takes M >= 64; T is only 16-32) and it can go straight from
            # the pipelined shared-memory copy into the MMA
            acc_a = tl.zeros((BLOCK_N, BLOCK_T) if SWAP_AB else (BLOCK_T, BLOCK_N), dtype=tl.float32)
            acc_b = tl.zeros((BLOCK_N, BLOCK_T) if SWAP_AB else (BLOCK_T, BLOCK_N), dtype=tl.float32)
            # block pointers: tiles the compiler's pipelining can copy to shared memory asynchronously
            rows = 2 * N if SILU else N
            wa_bp = tl.make_block_ptr(w_ptr, (rows, K), (stride_w, 1), (pid_n * BLOCK_N, k_start), (BLOCK_N, BLOCK_K),
                                      (1, 0))
            wb_bp = tl.make_block_ptr(w_ptr, (rows, K), (stride_w, 1), (N + pid_n * BLOCK_N, k_start),
                                      (BLOCK_N, BLOCK_K), (1, 0))
        else:
            acc2_a = tl.zeros((BLOCK_N, 1 if REDUCE_EACH else BLOCK_K), dtype=tl.float32)
            acc2_b = tl.zeros((BLOCK_N, 1 if REDUCE_EACH else BLOCK_K), dtype=tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs_k < k_end
            if PREFETCH:
                # the next step's weights, requested before this step's arithmetic (masked off past the end)
                nk = offs_k + BLOCK_K
                next_ok = n_in[:, None] & (nk < k_end)[None, :]
                wa_next = tl.load(w_ptr + offs_n[:, None] * stride_w + nk[None, :], mask=next_ok, other=0.0)
                wb_next = wa_next
                if SILU:
                    wb_next = tl.load(w_ptr + rows_b[:, None] * stride_w + nk[None, :], mask=next_ok, other=0.0)
            elif USE_DOT and BLOCK_PTR:
                wa = tl.load(wa_bp, boundary_check=(0, 1), padding_option="zero")
                wa_bp = tl.advance(wa_bp, (0, BLOCK_K))
                if SILU:
                    wb = tl.load(wb_bp, boundary_check=(0, 1), padding_option="zero")
                    wb_bp = tl.advance(wb_bp, (0, BLOCK_K))
            else:  # the compiler's pipelining (num_stages) streams the tiles
                w_ok = n_in[:, None] & k_ok[None, :]
                wa = tl.load(w_ptr + offs_n[:, None] * stride_w + offs_k[None, :], mask=w_ok, other=0.0)
                if SILU:
                    wb = tl.load(w_ptr + rows_b[:, None] * stride_w + offs_k[None, :], mask=w_ok, other=0.0)
            x = tl.load(x_ptr + offs_t[:, None] * stride_x + offs_k[None, :], mask=t_in[:, None] & k_ok[None, :],
                        other=0.0)  # (BLOCK_T, BLOCK_K)
            if PRE_NORM:  # rms_norm's roundings: normalised row to x's dtype, then times the weight
                g = tl.load(norm_ptr + offs_k, mask=k_ok, other=0.0).to(tl.float32)
                x = ((x.to(tl.float32) * inv[:, None]).to(x.dtype).to(tl.float32) * g[None, :]).to(x.dtype)
            if USE_DOT and SWAP_AB:
                # fp8 -> bf16/fp16 is exact, so the products are the reference's.
                acc_a += tl.dot(wa.to(x.dtype), tl.trans(x), input_precision=DOT_PRECISION)
                if SILU:
                    acc_b += tl.dot(wb.to(x.dtype), tl.trans(x), input_precision=DOT_PRECISION)
            elif USE_DOT:
                acc_a += tl.dot(x, tl.trans(wa.to(x.dtype)), input_precision=DOT_PRECISION)
                if SILU:
                    acc_b += tl.dot(x, tl.trans(wb.to(x.dtype)), input_precision=DOT_PRECISION)
            else:
                xf = x.to(tl.float32)  # (1, BLOCK_K) against (BLOCK_N, BLOCK_K)
                if REDUCE_EACH:  # one running sum per row: few registers, a reduction every step
                    acc2_a += tl.sum(wa.to(tl.float32) * xf, axis=1, keep_dims=True)
                    if SILU:
                        acc2_b += tl.sum(wb.to(tl.float32) * xf, axis=1, keep_dims=True)
                else:  # a running sum per element: the reduction once, after the loop
                    acc2_a += wa.to(tl.float32) * xf
                    if SILU:
                        acc2_b += wb.to(tl.float32) * xf
            if PREFETCH:
                wa, wb = wa_next, wb_next
        if not USE_DOT:
            acc_a = tl.sum(acc2_a, axis=1)[None, :]
            acc_b = tl.sum(acc2_b, axis=1)[None, :]
        elif SWAP_AB:
            acc_a = tl.trans(acc_a)  # (BLOCK_T, BLOCK_N), as the epilogue and partial sums expect
            acc_b = tl.trans(acc_b)
        if PARTIAL:
            width = 2 * N if SILU else N
            base = out_ptr + (pid_k * T + offs_t[:, None]) * width + offs_n[None, :]
            mask = t_in[:, None] & n_in[None, :]
            tl.store(base, acc_a, mask=mask)
            if SILU:
                tl.store(base + N, acc_b, mask=mask)
        else:
            _epilogue(acc_a, acc_b, offs_t, offs_n, T, N, scale_ptr, bias_ptr, res_ptr, out_ptr,
                      HAS_SCALE, HAS_BIAS, SILU, ADD)

    @triton.jit
    def _reduce_kernel(part_ptr, scale_ptr, bias_ptr, res_ptr, out_ptr, T, N, SPLIT,
                       BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, HAS_SCALE: tl.constexpr,
                       HAS_BIAS: tl.constexpr, SILU: tl.constexpr, ADD: tl.constexpr, USE_PDL: tl.constexpr):
        # part (SPLIT, T, N or 2N) float32 -> out (T, N): the split-K sum, then the shared epilogue.
        pdl_prologue_done(USE_PDL)
        offs_t = tl.arange(0, BLOCK_T)
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (offs_t[:, None] < T) & (offs_n[None, :] < N)
        width = 2 * N if SILU else N
        acc_a = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        acc_b = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        for s in range(SPLIT):
            base = part_ptr + (s * T + offs_t[:, None]) * width + offs_n[None, :]
            acc_a += tl.load(base, mask=mask, other=0.0)
            if SILU:
                acc_b += tl.load(base + N, mask=mask, other=0.0)
        _epilogue(acc_a, acc_b, offs_t, offs_n, T, N, scale_ptr, bias_ptr, res_ptr, out_ptr,
                  HAS_SCALE, HAS_BIAS, SILU, ADD)


def launch(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None,
           norm_weight: torch.Tensor | None, residual: torch.Tensor | None, eps: float, silu: bool,
           cfg: Config | None = None, pdl: bool | None = None) -> torch.Tensor:
    """x (T, K), w (N, K) -> out (T, N) or (T, N/2) with silu: the body of splitserve::weight_product.
    cfg and pdl: forced (benchmarks); None picks them."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    w = w.contiguous()
    t, k = x.shape
    n = w.shape[0] // 2 if silu else w.shape[0]  # output columns
    out = torch.empty(t, n, dtype=x.dtype, device=x.device)
    if t == 0:
        return out
    # int(): under torch.compile the shapes may be symbolic; the block sizes are compile-time
    # constants of the kernel, so the graph specialises on them anyway.
    cfg = cfg or pick_config(int(t), int(n), int(k), w.element_size(), silu)
    dummy = w  # stands for an absent tensor: the kernel never reads it (its switch is off)
    flags = dict(HAS_SCALE=scale is not None, HAS_BIAS=bias is not None, SILU=silu, ADD=residual is not None,
                 **pdl_args(x, pdl))
    ptrs = [a if a is not None else dummy for a in (scale, bias)]
    res = residual.contiguous() if residual is not None else dummy
    n_tiles = triton.cdiv(n, cfg.block_n)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"  # tf32 would round fp32 inputs
    common = dict(BLOCK_T=cfg.block_t, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, USE_DOT=cfg.use_dot,
                  DOT_PRECISION=precision, PRE_NORM=norm_weight is not None, num_warps=cfg.num_warps,
                  num_stages=cfg.num_stages, PREFETCH=cfg.prefetch,
                  REDUCE_EACH=cfg.reduce_each, BLOCK_PTR=cfg.block_ptr, SWAP_AB=cfg.swap_ab and cfg.use_dot)
    norm = norm_weight if norm_weight is not None else dummy
    if cfg.split_k == 1:
        wrap_triton(_product_kernel)[(n_tiles, 1)](x, w, *ptrs, norm, res, out, t, n, k, x.stride(0), w.stride(0),
                                                   cfg.k_per_split, eps, PARTIAL=False, **flags, **common)
        return out
    part = torch.empty(cfg.split_k, t, 2 * n if silu else n, dtype=torch.float32, device=x.device)
    wrap_triton(_product_kernel)[(n_tiles, cfg.split_k)](x, w, *ptrs, norm, res, part, t, n, k, x.stride(0),
                                                         w.stride(0), cfg.k_per_split, eps, PARTIAL=True, **flags,
                                                         **common)
    wrap_triton(_reduce_kernel)[(n_tiles,)](part, *ptrs, res, out, t, n, cfg.split_k, BLOCK_T=cfg.block_t,
                                            BLOCK_N=cfg.block_n, **flags)
    return out


def _launch(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None,
            norm_weight: torch.Tensor | None, residual: torch.Tensor | None, eps: float, silu: bool) -> torch.Tensor:
    return launch(x, w, scale, bias, norm_weight, residual, eps, silu)


_op = triton_op("weight_product")(_launch) if HAS_TRITON else _launch
