"""The candidate chain's γ dependent argmaxes in one launch.

The PyTorch reference is `chain_argmax_reference` (models/candidate_chain.py): γ index, add and
argmax steps, 2-3 launches each. Here one program holds K lanes and walks the block: each step
reads one row of the transition table, adds the candidates' own logits and takes the argmax
(first index on ties, like torch.argmax), so the chain costs one launch whatever γ is.
`chain_argmax` dispatches: Triton on CUDA tensors when triton is importable, the reference
otherwise. tests/test_kernel_verify.py checks they agree.
"""

from __future__ import annotations

import torch

from splitserve.accel import HAS_TRITON, triton_usable
from splitserve.models.candidate_chain import chain_argmax_reference


def chain_argmax(first: torch.Tensor, vals: torch.Tensor, trans: torch.Tensor) -> torch.Tensor:
    """first (K,), vals (γ-1, K), trans (γ-1, K, K), fp32 -> path (γ,) int64."""
    if triton_usable(first):
        return chain_argmax_triton(first, vals, trans)
    return chain_argmax_reference(first, vals, trans)


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _chain_kernel(first_ptr, vals_ptr, trans_ptr, out_ptr, steps, K, KB: tl.constexpr):
        j = tl.arange(0, KB)
        inside = j < K
        s = tl.load(first_ptr + j, mask=inside, other=float("-inf"))
        idx = tl.argmax(s, 0, tie_break_left=True).to(tl.int32)
        tl.store(out_ptr, idx.to(tl.int64))
        for k in range(steps):
            row = tl.load(trans_ptr + (k * K + idx) * K + j, mask=inside, other=float("-inf"))
            v = tl.load(vals_ptr + k * K + j, mask=inside, other=float("-inf"))
            idx = tl.argmax(v + row, 0, tie_break_left=True).to(tl.int32)
            tl.store(out_ptr + 1 + k, idx.to(tl.int64))


def chain_argmax_triton(first: torch.Tensor, vals: torch.Tensor, trans: torch.Tensor) -> torch.Tensor:
    steps, k = vals.shape  # γ-1, K
    out = torch.empty(steps + 1, dtype=torch.int64, device=first.device)
    _chain_kernel[(1,)](first.contiguous(), vals.contiguous(), trans.contiguous(), out, steps, k,
                        KB=triton.next_power_of_2(max(k, 2)))
    return out
