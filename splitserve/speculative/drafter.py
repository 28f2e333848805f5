"""The drafter seam: what a speculative round asks of the draft, whichever family it is.

A round (decode.py's reference loop, engine.py's static rounds) talks to its draft through two calls:

    propose(anchor, p, temperature, generator, window) -> tokens (γ,), probs (γ, V) | None, conf (γ,) | None
        γ draft tokens after the anchor x_p at position p; at T>0 the distributions they were
        drawn from, over the target's vocabulary (what verify_block's rejection rule reads); the
        confidences c_1..c_γ when the family has a confidence head.
    commit(aux, start, tokens, n, window)
        what the target committed: aux (1, T, m·D) its captured hidden states at positions
        start..start+T-1, tokens (T,) the token that followed each of those positions, rows 0..n
        committed, rows past n rejected. After the prefill: start 0, T = P, n = P-1, tokens the
        prompt's x_1.. and the anchor. After a verify: start p, T = γ+1 (the reference loop may
        pass only the n+1 committed rows), tokens [d_1..d_n, bonus, ...].

The target forward, `verify_block` (greedy or lossless rejection sampling) and the bookkeeping
are the round's own and the same for every family; only these two calls differ. Each family has
two drafters, one per caller:
    reference   p, start and n host ints; caches that hold exactly the committed positions
    engine      p, start and n () device tensors; preallocated caches written in place at fixed
                shapes, nothing read on the host (the round stays one CUDA graph); `window` (the
                round's attention window W, covering every slot it writes) bounds what is read

Families:
    DSpark, DFlash  a block drafted in one pass over the context K/V of the target's captures
                    (models/dspark.py); commit appends those captures (context.py)
    chain drafts    a chain of γ steps over the draft's own KV cache (eagle3_chain.py): every draft
                    whose class says `drafting = "chain"`, EAGLE-3 (models/eagle3.py) and the
                    target's own MTP head (models/mtp.py)
Glossary: γ tokens a round drafts, V target vocab, m·D captured width, P prompt length, L capacity.
"""

from __future__ import annotations

from functools import partial
from typing import Protocol

import torch

from splitserve.models.dspark import DSparkDraft
from splitserve.speculative.context import DynamicDraftContext, StaticDraftContext
from splitserve.speculative.eagle3_chain import Eagle3EngineDrafter, Eagle3ReferenceDrafter

Proposal = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]  # tokens (γ,), probs (γ, V), conf (γ,)
Index = int | torch.Tensor  # a host int (reference loop) or a () device tensor (engine)


class Drafter(Protocol):
    gamma: int  # γ

    def propose(self, anchor: torch.Tensor, p: Index, temperature: float = 0.0,
                generator: torch.Generator | None = None, window: int | None = None) -> Proposal: ...

    def commit(self, aux: torch.Tensor, start: Index, tokens: torch.Tensor, n: Index,
               window: int | None = None) -> None: ...


class DSparkReferenceDrafter:
    """DSpark's block over a context that grows by the committed captures."""

    def __init__(self, draft: DSparkDraft):
        self.draft, self.gamma = draft, draft.arch.block_size
        self.ctx = DynamicDraftContext(draft)

    def propose(self, anchor, p, temperature=0.0, generator=None, window=None) -> Proposal:
        kv, w = self.ctx.kv, self.draft.arch.context_window
        if w:  # the last W committed positions, p-W..p-1 (as training's mask, train/packing.py)
            kv = [(k[:, :, -w:], v[:, :, -w:]) for k, v in kv]
        return self.draft.draft(kv, anchor, p, temperature, generator)

    def commit(self, aux, start, tokens, n, window=None) -> None:
        self.ctx.append(aux[:, : n + 1], start)  # DSpark reads captures only, not the tokens


class DSparkEngineDrafter:
    """DSpark's block over the static context. `attend` (layers.Attend) reads the block's K/V in
    place in the context cache; None concatenates the context window with the block under a mask.
    A draft with a context window W reads slots p-W..p-1 of the context: the kernel through its
    sliding window of W+γ slots behind the block's last slot p+γ-1, the mask by its lower bound."""

    def __init__(self, draft: DSparkDraft, capacity: int, device: torch.device, dtype: torch.dtype,
                 attend=None, markov_topk: int = 0, markov_kernel: bool = True):
        self.draft, self.gamma = draft, draft.arch.block_size
        self.ctx = StaticDraftContext(draft, capacity, device, dtype)
        w = draft.arch.context_window
        if attend is not None and w:
            attend = partial(attend, sliding_window=w + self.gamma)
        self.attend, self.markov_topk, self.markov_kernel = attend, markov_topk, markov_kernel
        self._slots = torch.arange(capacity, device=device)  # (L,)

    def propose(self, anchor, p, temperature=0.0, generator=None, window=None) -> Proposal:
        if self.attend is not None:  # the block written at slots p..p+γ-1, read in place
            ctx, mask = self.ctx.kv, None
        else:
            ctx, mask = self.ctx.window(window), self.ctx.block_mask(p, window)
        return self.draft.draft(ctx, anchor, p, temperature, generator, ctx_mask=mask,
                                markov_topk=self.markov_topk, markov_kernel=self.markov_kernel,
                                attend=self.attend, window=window)

    def commit(self, aux, start, tokens, n, window=None) -> None:
        # All T rows, committed or not: slots past n stay hidden by the masks until overwritten.
        self.ctx.write(aux, start + self._slots[: aux.shape[1]])


def is_chain(draft) -> bool:
    return getattr(draft, "drafting", None) == "chain"


def reference_drafter(draft) -> Drafter:
    """A fresh drafter for one request of the reference loop (decode.py)."""
    if is_chain(draft):
        return Eagle3ReferenceDrafter(draft)
    if isinstance(draft, DSparkDraft):
        return DSparkReferenceDrafter(draft)
    raise TypeError(f"no drafter serves a {type(draft).__name__}")


def engine_drafter(draft, capacity: int, device: torch.device, attend=None, markov_topk: int = 0,
                   markov_kernel: bool = True) -> Drafter:
    """The engine's drafter: its caches preallocated for `capacity` slots in the draft's dtype.
    attend / markov_topk / markov_kernel are DSpark's serving options (EngineConfig)."""
    dtype = next(draft.parameters()).dtype
    if is_chain(draft):
        return Eagle3EngineDrafter(draft, capacity, device, dtype)
    if isinstance(draft, DSparkDraft):
        return DSparkEngineDrafter(draft, capacity, device, dtype, attend, markov_topk, markov_kernel)
    raise TypeError(f"no drafter serves a {type(draft).__name__}")
