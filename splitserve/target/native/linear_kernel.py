"""Weight-only linear for T <= 32 tokens in Triton: a GEMV / skinny GEMM that reads each weight once.

The PyTorch reference is `splitserve/target/native/linear.py`; `linear` here has its signature
and dispatches: the kernel on CUDA tensors when triton is importable, T <= 32 (a decode step, or
a verify step of γ+1 <= 17 tokens) and either the weight is fp8 or the caller passes
`prefer_triton=True` (for bf16 weights cuBLAS is the default); the reference otherwise.
tests/test_kernel_linear.py checks they agree, on CUDA or under TRITON_INTERPRET=1.

Design: at these T the call is weight-read bound, so the grid is over tiles of BLOCK_N weight
rows; each program streams its rows over K once and keeps every one of the T rows of x (tiny,
served from L2) against them, accumulating in float32. The fp8 scale is per output row, so it
multiplies each finished sum once instead of each weight; bias joins in the same epilogue. When
the N tiles alone are too few programs to keep the GPU's memory system busy (SmolLM2's down
projection, N = 576 and K = 1536), a second grid axis splits K, the programs write float32
partial sums and a small kernel adds them. Block sizes come from `pick_config(T, N, K, weight
bytes)`, not autotune, so the launch is the same under CUDA graph capture and torch.compile.
The kernel is registered as the custom op `splitserve::weight_linear` (torch.library.triton_op),
so torch.compile traces into it.

T = 1 multiplies the weight tile by the x row; 2 <= T <= 4 by broadcasting (x[:, None, :] *
w[None, :, :]); both sum over K once after the loop. 5 <= T <= 32 pads T to 16 or 32 and uses
tl.dot, which needs M >= 16 (the padding costs tensor-core work only, which is idle here).
Glossary: T tokens (rows of x), K in features, N out features.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from splitserve.accel import HAS_TRITON, triton_op, triton_usable, wrap_triton
from splitserve.target.native import linear as reference
from splitserve.target.native.linear import FP8, check_args

if HAS_TRITON:
    import triton
    import triton.language as tl

MAX_TRITON_T = 32
# Split-K when the N tiles alone leave SMs idle (fewer than one program per SM of an H200, 132),
# up to 2 programs per SM: a heuristic, so other GPUs just get a less tuned split.
SMS = 132
TARGET_PROGRAMS = 2 * SMS
TILE_BYTES = 8192  # weight bytes one program loads per K step
BROADCAST_ELEMS = 8192  # the (T, N, K) product tile of the broadcast path, in float32 registers


class Config(NamedTuple):
    block_t: int
    block_n: int
    block_k: int
    split_k: int  # programs along K
    k_per_split: int  # a multiple of block_k, so splits never share a K step
    use_dot: bool


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def pick_config(t: int, n: int, k: int, w_bytes: int) -> Config:
    """Block sizes for x (t, k) @ w (n, k).T with w_bytes bytes per weight (2 bf16, 1 fp8)."""
    use_dot = t > 4
    block_t = max(16, _pow2(t)) if use_dot else _pow2(t)
    block_n = 16
    block_k = TILE_BYTES // (block_n * w_bytes)
    if not use_dot:
        block_k = min(block_k, BROADCAST_ELEMS // (block_t * block_n))
    block_k = max(16, min(block_k, _pow2(k)))
    n_tiles, k_steps = -(-n // block_n), -(-k // block_k)
    split = 1
    if n_tiles < SMS:
        # Each split keeps >= 2 K steps: one step per program would be all latency.
        split = max(1, min(-(-TARGET_PROGRAMS // n_tiles), k_steps // 2))
    steps_per_split = -(-k_steps // split)
    split = -(-k_steps // steps_per_split)  # no empty split
    return Config(block_t, block_n, block_k, split, steps_per_split * block_k, use_dot)


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    prefer_triton: bool = False,
) -> torch.Tensor:
    """x (T, K), w (N, K) of x's dtype or fp8, scale (N,) fp32 iff fp8, bias (N,) -> y (T, N), x's dtype."""
    if triton_usable(x) and x.shape[0] <= MAX_TRITON_T and (w.dtype == FP8 or prefer_triton):
        return linear_triton(x, w, scale, bias)
    return reference.linear(x, w, scale, bias)


if HAS_TRITON:

    @triton.jit
    def _epilogue(acc, offs_t, offs_n, T, N, scale_ptr, bias_ptr, out_ptr,
                  HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr):
        # acc (BLOCK_T, BLOCK_N) float32 sums over all of K -> out (T, N) rows offs_t, columns offs_n.
        n_in = offs_n < N
        if HAS_SCALE:
            acc = acc * tl.load(scale_ptr + offs_n, mask=n_in, other=0.0)[None, :]
        if HAS_BIAS:
            acc = acc + tl.load(bias_ptr + offs_n, mask=n_in, other=0.0).to(tl.float32)[None, :]
        mask = (offs_t[:, None] < T) & n_in[None, :]
        tl.store(out_ptr + offs_t[:, None] * N + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _linear_kernel(x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr, T, N, K, stride_x, stride_w, k_per_split,
                       BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       USE_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, PARTIAL: tl.constexpr,
                       HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr):
        # Program (n, s): out rows offs_n over K range s. PARTIAL: float32 sums to out (split, T, N).
        pid_n, pid_k = tl.program_id(0), tl.program_id(1)
        offs_t = tl.arange(0, BLOCK_T)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        t_in, n_in = offs_t < T, offs_n < N
        k_start = pid_k * k_per_split
        k_end = tl.minimum(k_start + k_per_split, K)
        # Without tl.dot the products are summed over K once after the loop: a reduction per step
        # would cost shuffles every step. T = 1 (the decode step) keeps a 2D tile, the layout of w.
        if USE_DOT:
            acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        elif BLOCK_T == 1:
            acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        else:
            acc3 = tl.zeros((BLOCK_T, BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_in = offs_k < K
            x = tl.load(x_ptr + offs_t[:, None] * stride_x + offs_k[None, :],
                        mask=t_in[:, None] & k_in[None, :], other=0.0)  # (BLOCK_T, BLOCK_K)
            w = tl.load(w_ptr + offs_n[:, None] * stride_w + offs_k[None, :],
                        mask=n_in[:, None] & k_in[None, :], other=0.0)  # (BLOCK_N, BLOCK_K)
            if USE_DOT:
                # fp8 -> bf16/fp16 is exact, so the products are the reference's.
                acc += tl.dot(x, tl.trans(w.to(x.dtype)), input_precision=DOT_PRECISION)
            elif BLOCK_T == 1:
                acc2 += w.to(tl.float32) * x.to(tl.float32)  # (BLOCK_N, BLOCK_K) * (1, BLOCK_K)
            else:
                acc3 += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
        if not USE_DOT:
            if BLOCK_T == 1:
                acc = tl.sum(acc2, axis=1)[None, :]
            else:
                acc = tl.sum(acc3, axis=2)
        if PARTIAL:
            mask = t_in[:, None] & n_in[None, :]
            tl.store(out_ptr + (pid_k * T + offs_t[:, None]) * N + offs_n[None, :], acc, mask=mask)
        else:
            _epilogue(acc, offs_t, offs_n, T, N, scale_ptr, bias_ptr, out_ptr, HAS_SCALE, HAS_BIAS)

    @triton.jit
    def _reduce_kernel(part_ptr, scale_ptr, bias_ptr, out_ptr, T, N, SPLIT,
                       BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                       HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr):
        # part (SPLIT, T, N) float32 -> out (T, N): the split-K sum, then the shared epilogue.
        offs_t = tl.arange(0, BLOCK_T)
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (offs_t[:, None] < T) & (offs_n[None, :] < N)
        acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        for s in range(SPLIT):
            acc += tl.load(part_ptr + (s * T + offs_t[:, None]) * N + offs_n[None, :], mask=mask, other=0.0)
        _epilogue(acc, offs_t, offs_n, T, N, scale_ptr, bias_ptr, out_ptr, HAS_SCALE, HAS_BIAS)


def _launch(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    # x (T, K), w (N, K) -> out (T, N): the body of the custom op splitserve::weight_linear
    x = x if x.stride(-1) == 1 else x.contiguous()
    w = w.contiguous()
    t, k = x.shape
    n = w.shape[0]
    out = torch.empty(t, n, dtype=x.dtype, device=x.device)
    if t == 0:
        return out
    # int(): under torch.compile the shapes may be symbolic; the block sizes are compile-time
    # constants of the kernel, so the graph specialises on them anyway.
    cfg = pick_config(int(t), int(n), int(k), w.element_size())
    dummy = w  # stands for an absent scale / bias: the kernel never reads it (HAS_* is False)
    scale_arg = scale if scale is not None else dummy
    bias_arg = bias if bias is not None else dummy
    flags = dict(HAS_SCALE=scale is not None, HAS_BIAS=bias is not None)
    n_tiles = triton.cdiv(n, cfg.block_n)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"  # tf32 would round fp32 inputs
    common = dict(BLOCK_T=cfg.block_t, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, USE_DOT=cfg.use_dot,
                  DOT_PRECISION=precision, num_warps=4)
    if cfg.split_k == 1:
        wrap_triton(_linear_kernel)[(n_tiles, 1)](x, w, scale_arg, bias_arg, out, t, n, k, x.stride(0), w.stride(0),
                                           cfg.k_per_split, PARTIAL=False, **flags, **common)
        return out
    part = torch.empty(cfg.split_k, t, n, dtype=torch.float32, device=x.device)  # (split, T, N)
    wrap_triton(_linear_kernel)[(n_tiles, cfg.split_k)](x, w, scale_arg, bias_arg, part, t, n, k, x.stride(0),
                                                 w.stride(0), cfg.k_per_split, PARTIAL=True, **flags, **common)
    wrap_triton(_reduce_kernel)[(n_tiles,)](part, scale_arg, bias_arg, out, t, n, cfg.split_k,
                                     BLOCK_T=cfg.block_t, BLOCK_N=cfg.block_n, **flags)
    return out


_run = triton_op("weight_linear")(_launch) if HAS_TRITON else _launch


def linear_triton(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The kernel for any T (the dispatcher keeps it to T <= 32, the sizes it is built for): same contract."""
    check_args(x, w, scale, bias)
    return _run(x, w, scale, bias)
