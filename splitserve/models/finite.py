"""Keep a broken draft from killing the serving process at T > 0.

A draft's draws go through torch.multinomial. On CUDA it raises a device-side assert when a
distribution holds a NaN or an inf, and that assert ends the whole process (a server's CUDA
context with it), not one request. Non-finite logits come from a draft that is broken (a
diverged run, weights that overflow the serving dtype), never from a healthy one, so the guard
changes nothing a working draft computes. Where it fires, the draft proposes from the uniform
distribution instead: verification tests each token against the distribution it was drawn from,
so output stays exactly the target's, and the draft is only accepted less (τ shows it).
Greedy rounds need no guard: an argmax over non-finite logits still returns an index.
"""

from __future__ import annotations

import torch


def finite_or_zero(logits: torch.Tensor, *others: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """logits (..., N), and any tensors computed alongside them -> (logits, *others), unchanged
    when every logit is finite, else all zeros (zero logits: the uniform draw). On the device,
    no host sync, so a round's CUDA graph captures it."""
    ok = torch.isfinite(logits).all()  # ()
    return tuple(torch.where(ok, t, torch.zeros((), dtype=t.dtype, device=t.device)) for t in (logits, *others))
