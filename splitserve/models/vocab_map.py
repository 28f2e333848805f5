"""A draft's reduced vocabulary: the N target tokens it predicts (EAGLE-3's draft vocabulary).

The draft's lm_head has N rows instead of V. Its ids map to the target's as EAGLE-3, speculators
and SGLang store them:
    used  (N,)  the target ids of the draft vocabulary, ascending
    d2t   (N,)  int64 offsets: target id = draft id + d2t[draft id]  (d2t[i] = used[i] - i)
    t2d   (V,)  bool: True at the target ids the draft can propose
The N ids are the most frequent tokens among the trained (loss-masked) tokens of the training
data, ties to the lower id; when the data holds fewer than N distinct tokens the rest are the
lowest unused ids, so the map always has exactly N entries and the draft's shapes never depend on
the data. Glossary: V target vocab, N draft vocab.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass
class VocabMap:
    """The two tensors as stored; `check` tells whether they describe one vocabulary (the
    constructors below check, a model's buffers are read unchecked on the hot path)."""

    d2t: torch.Tensor  # (N,) int64
    t2d: torch.Tensor  # (V,) bool

    def check(self) -> VocabMap:
        n, v = self.d2t.numel(), self.t2d.numel()
        if n > v or int(self.t2d.sum()) != n:
            raise ValueError(f"a vocabulary map of {n} draft ids needs exactly {n} of the {v} target ids marked "
                             f"in t2d, found {int(self.t2d.sum())}")
        if not torch.equal(self.used.cpu(), self.t2d.cpu().nonzero().squeeze(-1)):
            raise ValueError("d2t and t2d name different target ids (d2t must list t2d's ids in ascending order)")
        return self

    @classmethod
    def from_ids(cls, used: torch.Tensor, vocab_size: int) -> VocabMap:
        """used: (N,) distinct target ids, any order -> the map of those ids."""
        used = used.to(torch.long).sort().values
        if used.numel() and (int(used[0]) < 0 or int(used[-1]) >= vocab_size):
            raise ValueError(f"draft vocabulary ids must lie in 0..{vocab_size - 1}")
        if used.unique().numel() != used.numel():
            raise ValueError("draft vocabulary ids must be distinct")
        t2d = torch.zeros(vocab_size, dtype=torch.bool)
        t2d[used] = True
        return cls(used - torch.arange(used.numel()), t2d).check()

    @classmethod
    def first(cls, size: int, vocab_size: int) -> VocabMap:
        """The lowest `size` target ids: the map of a draft before its data is counted."""
        return cls.from_ids(torch.arange(size), vocab_size)

    @property
    def size(self) -> int:
        return self.d2t.numel()

    @property
    def used(self) -> torch.Tensor:
        """(N,) the target id of every draft id."""
        return torch.arange(self.size, device=self.d2t.device) + self.d2t

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """draft ids (...) -> target ids (...)."""
        return draft_ids + lookup(self.d2t, draft_ids)

    def to_draft(self, target_ids: torch.Tensor) -> torch.Tensor:
        """target ids (...) -> draft ids (...), -1 where the draft vocabulary lacks the token."""
        index = torch.cumsum(self.t2d.to(torch.long), 0) - 1  # (V,) draft id of each marked target id
        return torch.where(lookup(self.t2d, target_ids), lookup(index, target_ids), torch.full_like(target_ids, -1))


def lookup(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """table (V,), ids (...) -> table[ids] (...) as a gather on the device. Plain indexing with a
    0-dim tensor reads the index on the host (a sync), which breaks CUDA graph capture."""
    return table.index_select(0, ids.reshape(-1)).view(ids.shape)


def count_tokens(samples: Iterable[tuple[torch.Tensor, torch.Tensor]], vocab_size: int) -> torch.Tensor:
    """(input_ids (T,), loss_mask (T,)) pairs -> (V,) int64: how often each token is a trained token."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in samples:
        trained = torch.as_tensor(ids, dtype=torch.long)[torch.as_tensor(mask, dtype=torch.bool)]
        if trained.numel() and not 0 <= int(trained.min()) <= int(trained.max()) < vocab_size:
            raise ValueError(f"token ids outside the target vocabulary of {vocab_size}")
        counts += torch.bincount(trained, minlength=vocab_size)
    return counts


def top_tokens(counts: torch.Tensor, size: int) -> torch.Tensor:
    """(V,) counts -> (N,) the `size` most frequent ids (ties and unseen tokens: lower id first)."""
    if not 1 <= size <= counts.numel():
        raise ValueError(f"a draft vocabulary of {size} tokens does not fit a target vocabulary of {counts.numel()}")
    # A stable sort of ids by descending count keeps equal counts in ascending id order.
    order = torch.sort(-counts.to(torch.long), stable=True).indices
    return order[:size].sort().values


def build_vocab_map(counts: torch.Tensor, size: int) -> VocabMap:
    """The draft vocabulary of `size` ids from the training data's token counts (V,)."""
    return VocabMap.from_ids(top_tokens(counts, size), counts.numel())
