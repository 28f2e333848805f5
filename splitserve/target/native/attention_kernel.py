"""Attention of a few queries over the static KV cache in Triton (flash-decoding), and the dispatcher.

The PyTorch reference is `attention.py` beside this file (its docstring has the glossary and the
visibility rule); `decode_attention_triton` has the same signature and result, and
`decode_attention` dispatches: Triton on CUDA tensors for T <= MAX_TRITON_QUERIES when triton is
importable, the reference otherwise (a prefill, a CPU). tests/test_kernel_attention.py checks
they agree, on CUDA or under TRITON_INTERPRET=1.

Why a kernel: at decode and verify time the query rows are few (G*T: 3 for SmolLM2 decode, 68 for
an 8B verify of 17) and the window long, so the work is reading K/V once, spread over the whole
GPU. Grid (Hkv, splits, row blocks): program (h, s) takes every query row of kv head h (the G
heads of its group times the T queries, padded to >= 16 rows for tl.dot) and walks split s's
share of the window in BLOCK_KV tiles with an online softmax; a second kernel merges the splits'
partial (acc, max, sum). Tiles no query can see (above the highest position, or below the lowest
one's sliding window) are skipped, so a short context in a long window costs little.

CUDA graphs and torch.compile: no host sync (positions stays on the device; window and
sliding_window are Python ints, fixed per captured graph), and the launch goes through
`torch.library.triton_op("splitserve::decode_attention")` + `wrap_triton` where torch has them.
"""

from __future__ import annotations

import functools

import torch

from splitserve.accel import HAS_TRITON, compute_major, pdl_args, triton_op, triton_usable, wrap_triton
from splitserve.target.native import attention as reference

if HAS_TRITON:
    import triton
    import triton.language as tl

    from splitserve.accel import pdl_prologue_done

MAX_TRITON_QUERIES = 32
# Programs per SM that the split count aims for: enough to fill the GPU while K/V streams in.
# A decode program (a few rows) is light, so two per SM; a verify program (a full row block)
# does BLOCK_M times the work per tile, and one per SM with longer splits was faster on an H200
# (docs/results/engine_h200.md, "Attention splits").
PROGRAMS_PER_SM = 2
PROGRAMS_PER_SM_FULL_ROWS = 1
FULL_ROWS = 32  # rows per kv head from which a program counts as a verify one
DEFAULT_SMS = 132  # an H200; used when the tensors are not on CUDA (the interpreter)
MAX_SPLITS = 64  # the merge kernel holds all splits of a row at once
# A verify program's K/V loads pipelined three deep instead of two, on Hopper at hd >= 128: at the
# 8B shape (68 rows, hd 128) on an H100 the kernel took 23.0 µs instead of 29.9 at an 8,192 window
# and 13.7 instead of 14.9 at 2,048 (docs/results/head_options_h100.md, "Verify attention").
# Three stages of K and V tiles take about 96 KB of shared memory at hd 128, which Hopper holds and
# smaller parts may not. Decode's few rows keep two: three were not measured at their own tile.
STAGES = 2
STAGES_FULL_ROWS_HOPPER = 3
LOG2E = 1.4426950408889634


HEAD_DIMS = (16, 32, 64, 128, 256)  # the kernel's constexpr head sizes; others take the reference


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    positions: torch.Tensor,
    window: int,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """q (T, Hq, hd), k_cache / v_cache (Hkv, L, hd), positions (T,) int64, any stride (a draft block
    passes one slot expanded) -> out (T, Hq, hd)."""
    if triton_usable(q) and q.shape[0] <= MAX_TRITON_QUERIES and q.shape[-1] in HEAD_DIMS:
        return decode_attention_triton(q, k_cache, v_cache, positions, window, scale, sliding_window)
    return reference.decode_attention(q, k_cache, v_cache, positions, window, scale, sliding_window)


def decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    positions: torch.Tensor,
    window: int,
    scale: float,
    sliding_window: int | None = None,
    *,
    num_splits: int | None = None,
    row_tile: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Same contract as the reference. num_splits, row_tile (BLOCK_M, a power of two >= 16) and
    num_stages (software pipelining depth) force the launch shape, for tests and for timing
    alternatives (bench/attention_gpu.py); None picks each as `plan` does."""
    assert sliding_window is None or sliding_window > 0, sliding_window
    assert row_tile is None or (row_tile >= 16 and row_tile & (row_tile - 1) == 0), row_tile
    return _op(q, k_cache, v_cache, positions, int(window), float(scale), sliding_window or 0, num_splits or 0,
               row_tile or 0, num_stages or 0)


def plan(rows: int, Hkv: int, hd: int, window: int, device: torch.device, num_splits: int = 0, row_tile: int = 0):
    """Launch shape for rows = G*T query rows per kv head -> (BLOCK_M, BLOCK_KV, row blocks,
    splits, tiles per split). The row tile is capped so the fp32 accumulator (BLOCK_M, hd) stays
    in registers; past the cap the rows take several programs that read the same K/V (from L2).
    Splits aim at PROGRAMS_PER_SM programs per SM (PROGRAMS_PER_SM_FULL_ROWS from FULL_ROWS
    rows on), with at least one tile each. row_tile > 0 forces BLOCK_M."""
    block_m = row_tile or min(max(16, triton.next_power_of_2(rows)), 128 if hd <= 128 else 64)
    block_kv = 64 if hd <= 128 else 32
    row_blocks = triton.cdiv(rows, block_m)
    tiles = triton.cdiv(window, block_kv)
    if not num_splits:
        sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device()) \
            if device.type == "cuda" else DEFAULT_SMS
        per_sm = PROGRAMS_PER_SM_FULL_ROWS if rows >= FULL_ROWS else PROGRAMS_PER_SM
        num_splits = min(triton.cdiv(per_sm * sms, Hkv * row_blocks), MAX_SPLITS)
    tiles_per_split = triton.cdiv(tiles, min(num_splits, tiles))
    return block_m, block_kv, row_blocks, triton.cdiv(tiles, tiles_per_split), tiles_per_split


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


if HAS_TRITON:

    @triton.jit
    def _split_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, out_ptr, acc_ptr, m_ptr, l_ptr,
                      T, window, sliding, tiles_per_split, qk_scale: tl.constexpr, rows_pad,
                      sqt, sqh, sqd, spt, skh, skl, skd, svh, svl, svd, sot, soh,
                      G: tl.constexpr, HD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_KV: tl.constexpr,
                      HAS_SW: tl.constexpr, SINGLE: tl.constexpr, PREC: tl.constexpr, USE_PDL: tl.constexpr):
        # Program (h, s, b): rows b*BLOCK_M.. of kv head h (row r = query r // G of head h*G + r % G,
        # so a row's G heads are adjacent in memory) over split s's slots.
        pdl_prologue_done(USE_PDL)
        h, s, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        rows = b * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < T * G
        t = rows // G
        head = h * G + rows % G
        d = tl.arange(0, HD)
        q = tl.load(q_ptr + t[:, None] * sqt + head[:, None] * sqh + d[None, :] * sqd,
                    mask=row_ok[:, None], other=0.0)  # (BLOCK_M, HD)
        # positions through its stride: a draft block passes its last slot expanded to every query
        # (stride 0), and reading it as contiguous would take the bytes after that one element
        pos = tl.load(pos_ptr + t * spt, mask=row_ok, other=0).to(tl.int32)  # (BLOCK_M,)

        lo = s * tiles_per_split * BLOCK_KV
        # Slots above every row's position are invisible to all: stop there.
        hi = tl.minimum(tl.minimum(lo + tiles_per_split * BLOCK_KV, window),
                        tl.max(tl.where(row_ok, pos, -1), 0) + 1)
        if HAS_SW:  # and start at the tile holding the lowest slot any row's window still sees
            first = tl.maximum(tl.min(tl.where(row_ok, pos, window), 0) - sliding + 1, 0)
            lo = tl.maximum(lo, (first // BLOCK_KV) * BLOCK_KV)

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max, log2 units
        l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(score - m_i)
        acc = tl.zeros([BLOCK_M, HD], tl.float32)
        for start in range(lo, hi, BLOCK_KV):
            j = start + tl.arange(0, BLOCK_KV)
            inside = j < hi  # never read past the window: those slots may hold anything
            k = tl.load(k_ptr + h * skh + j[:, None] * skl + d[None, :] * skd, mask=inside[:, None], other=0.0)
            v = tl.load(v_ptr + h * svh + j[:, None] * svl + d[None, :] * svd, mask=inside[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale  # (BLOCK_M, BLOCK_KV)
            visible = inside[None, :] & (j[None, :] <= pos[:, None])
            if HAS_SW:
                visible = visible & (j[None, :] > pos[:, None] - sliding)
            scores = tl.where(visible, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            # A row with nothing visible yet keeps m = -inf; subtract 0 there so exp2 gives 0, not NaN.
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(scores - m_sub[:, None])
            alpha = tl.exp2(m_i - m_sub)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
            m_i = m_new

        if SINGLE:  # one split: this program's rows are final
            o = acc / tl.where(row_ok, l_i, 1.0)[:, None]  # padding rows have l = 0
            tl.store(out_ptr + t[:, None] * sot + head[:, None] * soh + d[None, :],
                     o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
        else:
            part = (h * tl.num_programs(1) + s) * rows_pad + rows  # (BLOCK_M,) into (Hkv, S, rows_pad)
            tl.store(m_ptr + part, m_i, mask=row_ok)
            tl.store(l_ptr + part, l_i, mask=row_ok)
            # The merge reads a partial accumulator only where its max is finite: a split with no
            # visible slot (lo >= hi) and the padding rows write nothing else.
            tl.store(acc_ptr + part[:, None] * HD + d[None, :], acc, mask=row_ok[:, None] & (lo < hi))

    @triton.jit
    def _merge_kernel(acc_ptr, m_ptr, l_ptr, out_ptr, splits, rows_pad, sot, soh,
                      G: tl.constexpr, HD: tl.constexpr, S_BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
        # Program (h, r): row r of kv head h, weighted over its splits by exp2(m_s - max m).
        pdl_prologue_done(USE_PDL)
        h, r = tl.program_id(0), tl.program_id(1)
        sidx = tl.arange(0, S_BLOCK)
        s_ok = sidx < splits
        part = (h * splits + sidx) * rows_pad + r  # (S_BLOCK,)
        m = tl.load(m_ptr + part, mask=s_ok, other=float("-inf"))
        l_s = tl.load(l_ptr + part, mask=s_ok, other=0.0)
        d = tl.arange(0, HD)
        # Splits whose tiles were all skipped have m = -inf, weight 0 and no stored accumulator:
        # their rows are not read (a stale value there could be NaN, and 0 * NaN is NaN).
        live = s_ok & (m > float("-inf"))
        acc = tl.load(acc_ptr + part[:, None] * HD + d[None, :], mask=live[:, None], other=0.0)  # (S_BLOCK, HD)
        m_max = tl.max(m, 0)
        w = tl.where(live, tl.exp2(m - m_max), 0.0)
        o = tl.sum(acc * w[:, None], 0) / tl.sum(l_s * w, 0)
        tl.store(out_ptr + (r // G) * sot + (h * G + r % G) * soh + d, o.to(out_ptr.dtype.element_ty))


def _launch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor,
            window: int, scale: float, sliding_window: int, num_splits: int, row_tile: int = 0,
            num_stages: int = 0) -> torch.Tensor:
    """The body of the registered op; sliding_window 0 = none; num_splits, row_tile, num_stages
    0 = automatic."""
    T, Hq, hd = q.shape
    Hkv = k_cache.shape[0]
    G = Hq // Hkv
    assert G * Hkv == Hq and v_cache.shape[0] == Hkv, (q.shape, k_cache.shape, v_cache.shape)
    assert hd in HEAD_DIMS and k_cache.shape[2] == hd, (hd, k_cache.shape)
    assert 0 < window <= k_cache.shape[1], (window, k_cache.shape)
    rows = G * T
    block_m, block_kv, row_blocks, splits, tiles_per_split = plan(rows, Hkv, hd, window, q.device, num_splits, row_tile)
    rows_pad = row_blocks * block_m
    out = torch.empty(T, Hq, hd, dtype=q.dtype, device=q.device)  # (T, Hq, hd)
    if splits > 1:
        acc = torch.empty(Hkv, splits, rows_pad, hd, dtype=torch.float32, device=q.device)
        m = torch.empty(Hkv, splits, rows_pad, dtype=torch.float32, device=q.device)
        l_sum = torch.empty_like(m)
    else:  # unused by the kernel
        acc = m = l_sum = out
    if not num_stages:
        num_stages = STAGES_FULL_ROWS_HOPPER if rows >= FULL_ROWS and hd >= 128 and compute_major(q) >= 9 else STAGES
    prec = "ieee" if q.dtype == torch.float32 else "tf32"  # fp32 in, fp32 products: no TF32 rounding
    wrap_triton(_split_kernel)[(Hkv, splits, row_blocks)](
        q, k_cache, v_cache, positions, out, acc, m, l_sum,
        T, window, sliding_window, tiles_per_split, scale * LOG2E, rows_pad,
        q.stride(0), q.stride(1), q.stride(2), positions.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
        G=G, HD=hd, BLOCK_M=block_m, BLOCK_KV=block_kv, HAS_SW=sliding_window > 0, SINGLE=splits == 1,
        PREC=prec, num_warps=8 if block_m * hd >= 128 * 128 else 4, num_stages=num_stages,
        **pdl_args(q))
    if splits > 1:
        s_block = triton.next_power_of_2(splits)
        wrap_triton(_merge_kernel)[(Hkv, rows)](
            acc, m, l_sum, out, splits, rows_pad, out.stride(0), out.stride(1),
            G=G, HD=hd, S_BLOCK=s_block, num_warps=8 if s_block * hd > 8192 else 4, **pdl_args(q))
    return out


_op = triton_op("decode_attention")(_launch) if HAS_TRITON else _launch
