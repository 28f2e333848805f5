"""The captured hidden states checked once before training: never empty, zero or blind to input.

A backend whose capture is broken for some layers (a hybrid model's recurrent layers handing back
a zeroed buffer, a hook on the wrong module) still trains without an error: the draft learns from
whatever else it sees and is useless when served. One forward of two different token sequences
(B=2, T=16) finds it at start and names the layer.
"""

from __future__ import annotations

import torch

from splitserve.errors import UserError
from splitserve.target.backend import CaptureTarget

PROBE_TOKENS = 16


def probe_ids(vocab: int, length: int = PROBE_TOKENS, seed: int = 0) -> torch.Tensor:
    """-> (2, T) token ids below `vocab`, the two rows different at every position (deterministic;
    the global RNG is not touched, so a run's own seeding is unchanged)."""
    g = torch.Generator().manual_seed(seed)
    first = torch.randint(vocab, (length,), generator=g)
    shift = torch.randint(1, vocab, (length,), generator=g)  # never 0: every position differs
    return torch.stack([first, (first + shift) % vocab])


def fault(h: torch.Tensor) -> str | None:
    """h: (2, T, D), the two rows captured from different inputs -> what is wrong, or None."""
    if not torch.isfinite(h).all():
        return "not finite"
    if not h.any():
        return "all zero"
    if torch.equal(h[0], h[1]):
        return "the same for both inputs"
    return None


def layer_faults(aux: torch.Tensor, layer_ids: tuple[int, ...], width: int) -> list[str]:
    """aux: (2, T, m*D), m layers of width D in layer_ids order -> "layer l: <fault>" per broken one."""
    found = []
    for j, layer in enumerate(layer_ids):
        what = fault(aux[..., j * width : (j + 1) * width])  # (2, T, D)
        if what:
            found.append(f"layer {layer}: {what}")
    return found


@torch.no_grad()
def check_capture_varies(target: CaptureTarget, length: int = PROBE_TOKENS) -> None:
    """Run `target.capture` once on two different `length`-token sequences; a UserError (one line)
    names each captured layer whose output is empty, all zero, not finite, or the same for both."""
    info = target.info
    vocab = info.vocab_size
    if target.tokenizer is not None and hasattr(target.tokenizer, "__len__"):
        vocab = min(vocab, len(target.tokenizer))  # rows past the tokenizer may be untrained padding
    cap = target.capture(probe_ids(vocab, length).to(target.device))
    m, d = len(info.layer_ids), info.hidden_size
    where = f"target {info.name}: its {type(target).__name__} capture"
    if tuple(cap.aux.shape) != (2, length, m * d):
        raise UserError(f"{where} gave hidden states of shape {tuple(cap.aux.shape)} for 2 x {length} tokens, "
                        f"not (2, {length}, {m * d}) = {m} layers {list(info.layer_ids)} x hidden size {d}")
    found = layer_faults(cap.aux, info.layer_ids, d)
    if cap.final is not None and (what := fault(cap.final)):
        found.append(f"final hidden state: {what}")
    if found:
        raise UserError(f"{where} is broken on two different {length}-token inputs ({'; '.join(found)}): a draft "
                        "would learn nothing from it; capture other layers (target.layer_ids=[...]) or use another "
                        "target.backend")
