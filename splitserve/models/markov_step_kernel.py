"""The exact greedy Markov stage with one launch per draft position.

The exact greedy stage (DSparkDraft.draft) runs γ dependent steps: gather z = W1[x_{k-1}],
the (V x r) product W2 z, the add to the backbone logits U_k and the argmax over V. That is
3-4 launches per position, γ x 3-4 a round, each too small to fill the GPU, so at batch 1 the
stage is launch-bound. Here each position is one launch of `_markov_step_kernel`: every program
takes BLOCK_V vocabulary rows, computes their U_k + W2 z and its best (value, index), and merges
it into the position's argmax with one 64-bit atomic max. The next launch decodes x_k from that
word, so the tokens never leave the device and the round stays capturable: γ + 2 launches (the
fill of the argmax words, γ steps, their decode, one kernel once compiled) against γ x 3-4.

It is exact, unlike the top-K candidate chain (candidate_chain.py): the argmax is over the whole
vocabulary, the values rounded to the model's dtype where torch rounds them (the product's
output, then the sum). The one difference from the loop is the order in which the product sums
its r terms (float32 here and in cuBLAS, but not the same order), so a token can differ only
where two logits lie within about one ulp of the dtype: a near tie either way.

Vanilla heads only, z_k = W1[x_{k-1}]: a gated head's z also depends on h_k, an rnn head's on
its state, so they keep the loop.
`markov_greedy_chain` dispatches: Triton on CUDA tensors when triton is importable, the
reference otherwise. tests/test_markov_step_kernel.py checks they agree.
Glossary: γ block size, V vocab, r Markov rank.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from splitserve.accel import HAS_TRITON, pdl_args, triton_op, triton_usable, wrap_triton

if HAS_TRITON:
    import triton
    import triton.language as tl

    from splitserve.accel import pdl_prologue_done


def tile(rank: int) -> tuple[int, int, int]:
    """(BLOCK_V vocabulary rows per program, r padded to a power of two, warps) for rank r.

    A program keeps its (BLOCK_V, r) slice of W2 in registers, since it loads the slice before
    waiting for the previous launch: at most 64 values a thread, i.e. 64 rows at r = 256 over 8
    warps, fewer rows for a larger r (no register spills on sm_90 up to r = 1024). SmolLM2's
    V = 49152 then gives 768 programs, several per SM."""
    rb = max(16, 1 << (rank - 1).bit_length())
    return max(16, min(64, 16384 // rb)), rb, 8


def markov_greedy_chain_reference(
    base: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, anchor_id: torch.Tensor
) -> torch.Tensor:
    """base (γ, V) backbone logits in the model's dtype, w1 (V, r) the W1 embedding, w2 (V, r)
    the weight of W2 = nn.Linear(r, V), anchor_id () -> tokens (γ,) int64.

    The loop of DSparkDraft.draft for a vanilla head, op for op (same ops on the same shapes,
    so the same roundings): x_k = argmax(U_k + W2 W1[x_{k-1}]), first index on ties."""
    tokens = []
    prev = anchor_id.view(1)  # (1,)
    for k in range(base.shape[0]):
        z = F.embedding(prev, w1).to(base.dtype)  # (1, r)
        prev = (base[k] + F.linear(z, w2)[0]).argmax(-1, keepdim=True)  # (1,)
        tokens.append(prev)
    return torch.cat(tokens)


def markov_greedy_chain(
    base: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, anchor_id: torch.Tensor
) -> torch.Tensor:
    """base (γ, V), w1 (V, r), w2 (V, r), anchor_id () -> tokens (γ,) int64."""
    if triton_usable(base):
        return _markov_greedy_chain_op(base.contiguous(), w1.contiguous(), w2.contiguous(), anchor_id)
    return markov_greedy_chain_reference(base, w1, w2, anchor_id)


if HAS_TRITON:

    @triton.jit(do_not_specialize=["k"])  # one compiled kernel for every k, not one for k = 1
    def _markov_step_kernel(base_ptr, w1_ptr, w2_ptr, anchor_ptr, keys_ptr, k, V, R: tl.constexpr,
                            BLOCK_V: tl.constexpr, RB: tl.constexpr, USE_PDL: tl.constexpr):
        # Program p: rows p*BLOCK_V.. of position k. keys[k] gathers, over all programs, the best
        # (value, index) packed in one int64 that orders as the argmax does (see the end).
        rows = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
        cols = tl.arange(0, RB)
        in_rows, in_cols = rows < V, cols < R
        # W2 is never written, so its tile is read before the wait for the previous launch.
        w2 = tl.load(w2_ptr + rows.to(tl.int64)[:, None] * R + cols[None, :],
                     mask=in_rows[:, None] & in_cols[None, :], other=0.0)  # (BLOCK_V, RB)
        pdl_prologue_done(USE_PDL)
        if k == 0:
            prev = tl.load(anchor_ptr).to(tl.int64)
        else:
            prev_key = tl.load(keys_ptr + k - 1)
            prev = 2147483647 - (prev_key - ((prev_key >> 32) << 32))
        dtype = base_ptr.dtype.element_ty
        z = tl.load(w1_ptr + prev * R + cols, mask=in_cols, other=0.0).to(dtype)  # (RB,): W1[x_{k-1}]
        # Rounded as torch rounds: the product's output to the dtype, then the sum.
        bias = tl.sum(w2.to(tl.float32) * z.to(tl.float32)[None, :], 1).to(dtype)  # (BLOCK_V,)
        u = tl.load(base_ptr + k * V + rows, mask=in_rows, other=0.0)
        logit = (u.to(tl.float32) + bias.to(tl.float32)).to(dtype).to(tl.float32)
        logit = tl.where(in_rows, logit, float("-inf"))
        # Pack (value, index) so that int64 order is argmax order: -0.0 made +0.0 (torch finds
        # them equal), the float's bits flipped below zero so that signed order is float order,
        # then the index counted down in the low word, so equal values keep the smaller index.
        logit = tl.where(logit == 0.0, 0.0, logit)
        bits = logit.to(tl.int32, bitcast=True)
        ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
        key = (ordered.to(tl.int64) << 32) + (2147483647 - rows).to(tl.int64)
        tl.atomic_max(keys_ptr + k, tl.max(key, 0))

    @triton_op("markov_greedy_chain")
    def _markov_greedy_chain_op(base: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                                anchor_id: torch.Tensor) -> torch.Tensor:
        gamma, vocab = base.shape
        rank = w2.shape[1]
        keys = torch.full((gamma,), torch.iinfo(torch.int64).min, dtype=torch.int64, device=base.device)  # (γ,)
        block_v, rb, warps = tile(rank)
        grid = (triton.cdiv(vocab, block_v),)
        launch = dict(R=rank, BLOCK_V=block_v, RB=rb, num_warps=warps, **pdl_args(base))  # the same for every k
        for k in range(gamma):
            wrap_triton(_markov_step_kernel)[grid](base, w1, w2, anchor_id, keys, k, vocab, **launch)
        return 2147483647 - (keys & 0xFFFFFFFF)  # (γ,): the index from each low word
