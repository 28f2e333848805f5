"""Verification kernels: the accept/reject step of one speculative round in one or two launches.

The PyTorch reference is `splitserve/speculative/verify.py`; every function here has the same
signature and returns the same values (tests/test_kernel_verify.py checks it, on CUDA or under
TRITON_INTERPRET=1). `greedy_verify` / `sampling_verify` below dispatch: Triton on CUDA tensors
when triton is importable, the reference otherwise, so callers never branch. Triton is an
optional dependency (it comes with CUDA builds of torch).

Why a kernel: the reference runs ~6 small ops over (γ+1, V) logits; the kernel reads them once,
and everything stays on the device either way (no .item()).
Glossary: γ block size, V vocab.
"""

from __future__ import annotations

import torch

from splitserve.accel import HAS_TRITON, triton_usable
from splitserve.speculative import verify as reference

if HAS_TRITON:
    import triton
    import triton.language as tl

BLOCK_V = 1024


def greedy_verify(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_tokens (γ,), target_logits (γ+1, V) -> (n_accepted (), bonus ())."""
    if triton_usable(target_logits):
        return greedy_verify_triton(draft_tokens, target_logits)
    return reference.greedy_verify(draft_tokens, target_logits)


def sampling_verify(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    uniform: torch.Tensor,
    residual_noise: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejection sampling, same arguments as the reference -> (n_accepted (), next token ())."""
    if triton_usable(target_probs):
        return sampling_verify_triton(draft_tokens, draft_probs, target_probs, uniform, residual_noise)
    return reference.sampling_verify(draft_tokens, draft_probs, target_probs, uniform, residual_noise)


if HAS_TRITON:

    @triton.jit
    def _chunk_argmax_kernel(logits_ptr, stride_row, V, val_ptr, idx_ptr, chunks, BLOCK: tl.constexpr):
        # Program (r, c): max and argmax of row r over vocab chunk c (first index on ties).
        # Splitting each row over many programs keeps the read parallel: one program per row
        # would walk the whole vocab tile by tile, serially.
        row, chunk = tl.program_id(0), tl.program_id(1)
        offs = chunk * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(logits_ptr + row * stride_row + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        tl.store(val_ptr + row * chunks + chunk, tl.max(x, 0))
        tl.store(idx_ptr + row * chunks + chunk, tl.argmax(x, 0, tie_break_left=True).to(tl.int32) + chunk * BLOCK)

    @triton.jit
    def _greedy_finish_kernel(val_ptr, idx_ptr, chunks, draft_ptr, gamma, out_ptr,
                              RB: tl.constexpr, CB: tl.constexpr):
        # One program: per row the first chunk holding the row's max (so the first index
        # overall, like torch.argmax), then n = the first row r < γ whose argmax is not d_{r+1},
        # and the bonus argmax of row n.
        r = tl.arange(0, RB)[:, None]
        c = tl.arange(0, CB)[None, :]
        inside = (r <= gamma) & (c < chunks)
        vals = tl.load(val_ptr + r * chunks + c, mask=inside, other=float("-inf"))
        idxs = tl.load(idx_ptr + r * chunks + c, mask=inside, other=0)
        best = tl.argmax(vals, 1, tie_break_left=True)  # (RB,)
        top = tl.sum(tl.where(c == best[:, None], idxs, 0), 1)  # (RB,): argmax of each row
        rows = tl.arange(0, RB)
        d = tl.load(draft_ptr + rows, mask=rows < gamma, other=-1).to(tl.int32)
        miss = (rows < gamma) & (d != top)
        n = tl.min(tl.where(miss, rows, gamma), 0)
        tl.store(out_ptr, n.to(tl.int64))
        tl.store(out_ptr + 1, tl.sum(tl.where(rows == n, top, 0), 0).to(tl.int64))

    @triton.jit
    def _sampling_kernel(draft_ptr, p_ptr, q_ptr, u_ptr, e_ptr, out_ptr, gamma, V, stride_p, stride_q,
                         G: tl.constexpr, BLOCK: tl.constexpr):
        # One program. Accept tests for k = 0..γ-1: u_k p_k(d_k) < q_k(d_k); n = first failure.
        k = tl.arange(0, G)
        valid = k < gamma
        d = tl.load(draft_ptr + k, mask=valid, other=0)
        pk = tl.load(p_ptr + k * stride_p + d, mask=valid, other=0.0)
        qk = tl.load(q_ptr + k * stride_q + d, mask=valid, other=0.0)
        u = tl.load(u_ptr + k, mask=valid, other=1.0)
        rejected = valid & (u * pk >= qk)
        n = tl.min(tl.where(rejected, k, gamma), 0)
        # p_{γ+1} = 0: after a full accept the draw is from q_γ itself. Row γ of p does not
        # exist, so read row γ-1 and zero it.
        p_row = tl.minimum(n, gamma - 1)
        p_scale = (n < gamma).to(tl.float32)
        # Next token: exponential race over r = max(0, q_n - p_n), or over q_n if r is empty.
        r_best = tl.full([], -1.0, tl.float32)
        r_idx = tl.zeros([], dtype=tl.int32)
        q_best = tl.full([], -1.0, tl.float32)
        q_idx = tl.zeros([], dtype=tl.int32)
        r_sum = tl.zeros([], dtype=tl.float32)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            inside = offs < V
            q = tl.load(q_ptr + n * stride_q + offs, mask=inside, other=0.0).to(tl.float32)
            p = tl.load(p_ptr + p_row * stride_p + offs, mask=inside, other=0.0).to(tl.float32) * p_scale
            e = tl.load(e_ptr + offs, mask=inside, other=1.0).to(tl.float32)
            r = tl.maximum(q - p, 0.0)
            r_sum += tl.sum(r, 0)
            # div_rn: IEEE division like torch (plain / is approximate on NVIDIA GPUs)
            sr = tl.where(inside, tl.math.div_rn(r, e), -1.0)
            sq = tl.where(inside, tl.math.div_rn(q, e), -1.0)
            sr_max, sq_max = tl.max(sr, 0), tl.max(sq, 0)
            sr_idx = tl.argmax(sr, 0, tie_break_left=True).to(tl.int32) + start
            sq_idx = tl.argmax(sq, 0, tie_break_left=True).to(tl.int32) + start
            r_idx = tl.where(sr_max > r_best, sr_idx, r_idx)
            r_best = tl.maximum(sr_max, r_best)
            q_idx = tl.where(sq_max > q_best, sq_idx, q_idx)
            q_best = tl.maximum(sq_max, q_best)
        tl.store(out_ptr, n.to(tl.int64))
        tl.store(out_ptr + 1, tl.where(r_sum > 0, r_idx, q_idx).to(tl.int64))


def greedy_verify_triton(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows, vocab = target_logits.shape  # γ+1, V
    logits = target_logits.contiguous()
    chunks = triton.cdiv(vocab, BLOCK_V)
    vals = torch.empty(rows, chunks, dtype=torch.float32, device=logits.device)  # (γ+1, chunks)
    idxs = torch.empty(rows, chunks, dtype=torch.int32, device=logits.device)
    out = torch.empty(2, dtype=torch.int64, device=logits.device)  # n, bonus
    _chunk_argmax_kernel[(rows, chunks)](logits, logits.stride(0), vocab, vals, idxs, chunks, BLOCK=BLOCK_V)
    _greedy_finish_kernel[(1,)](vals, idxs, chunks, draft_tokens.contiguous(), rows - 1, out,
                                RB=triton.next_power_of_2(rows), CB=triton.next_power_of_2(chunks))
    return out[0], out[1]


def sampling_verify_triton(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    uniform: torch.Tensor,
    residual_noise: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    gamma, vocab = draft_probs.shape
    p, q = draft_probs.float().contiguous(), target_probs.float().contiguous()
    out = torch.empty(2, dtype=torch.int64, device=q.device)
    _sampling_kernel[(1,)](draft_tokens.contiguous(), p, q, uniform.float().contiguous(),
                           residual_noise.float().contiguous(), out, gamma, vocab, p.stride(0), q.stride(0),
                           G=triton.next_power_of_2(max(gamma, 2)), BLOCK=BLOCK_V)
    return out[0], out[1]
