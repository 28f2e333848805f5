"""Float comparisons that hold on any x86 CPU.

Two code paths that compute the same float32 values mathematically (another module instance,
other shapes, another kernel) agree to a few ulps, not bitwise: MKL and oneDNN pick their
blocking, hence the order of every sum, by CPU (AVX2 or AVX-512, Intel or AMD) and by memory
alignment. Compare such results with `assert_float32_close`. Keep `torch.equal` for results
that are the same bytes: integer and bool tensors, a tensor written and read back, a copy,
or the same ops replayed on the same shapes by the same build on the same machine.

Greedy tokens stay exact. Where a test compares the argmax of two such code paths, it first
checks with `assert_tie_free` that no row is a near tie, so the exact comparison cannot flip.
"""

from __future__ import annotations

import torch

# float32 eps is 1.2e-7; kernel drift is a few ulps of each op's operands. On the export round
# trip (test_float_tolerance.py), moving every weight by up to 2 ulps, or running in float64,
# uses under 5% of this tolerance; a swapped weight or a block one position off exceeds it 300x
# or more (they move the logits by ~1e-2 of their scale).
RTOL = 1e-5
# Within that tolerance each value moves by at most 2 RTOL of the scale, so a gap between two
# shrinks by at most 4 RTOL of it: a near tie is a runner-up within 10x that of the winner.
TIE_GAP = 10 * 4 * RTOL


def _scale(want: torch.Tensor) -> float:
    return float(want.detach().abs().max()) if want.numel() else 0.0


def assert_float32_close(got: torch.Tensor, want: torch.Tensor, rtol: float = RTOL) -> None:
    """|got - want| <= rtol * (|want| + max|want|), elementwise.

    The max|want| term is the absolute part: a value near zero is a sum of terms of the tensor's
    own scale, and carries their rounding, so an elementwise relative bound alone would fail it.
    """
    torch.testing.assert_close(got, want, rtol=rtol, atol=rtol * _scale(want))


def assert_tie_free(logits: torch.Tensor, what: str = "logits") -> None:
    """Every row's best value beats its runner-up by more than TIE_GAP of the row's scale, so any
    two float32 computations of these logits pick the same argmax. (V,) or (..., V)."""
    rows = logits.detach().float().reshape(-1, logits.shape[-1])
    if rows.shape[-1] < 2:
        return
    top2 = rows.topk(2, dim=-1).values
    gap = top2[:, 0] - top2[:, 1]
    need = TIE_GAP * rows.abs().amax(-1)
    bad = (gap <= need).nonzero().flatten().tolist()
    assert not bad, (
        f"{what}: near tie in rows {bad} (gaps {gap[bad].tolist()}, need > {need[bad].tolist()}); "
        "another kernel could pick the other token: use other inputs"
    )
