"""The draft's context cache: K/V of the target's captured hidden states, one entry per
committed position, extended every round with the accepted tokens' captures.

Two stores with one job and two memory layouts:
    DynamicDraftContext  grows by concatenation; holds exactly positions 0..p-1 (reference loop)
    StaticDraftContext   preallocated (1, Hkv, L, hd) per layer, written in place at device
                         positions; a mask says which slots are committed (serving, CUDA graphs)
Both compute the new K/V the same way: `draft.context_kv(aux, positions)`.
Glossary: C context positions, L capacity, γ block size, m·D captured width.
"""

from __future__ import annotations

import torch

from splitserve.models.dspark import DSparkDraft

KV = list[tuple[torch.Tensor, torch.Tensor]]


class DynamicDraftContext:
    def __init__(self, draft: DSparkDraft):
        self.draft = draft
        self.kv: KV | None = None  # per layer (1, Hkv, C, hd), C = committed positions

    def append(self, aux: torch.Tensor, start: int) -> None:
        """aux: (1, T, m*D) captures of positions start .. start+T-1, all committed."""
        pos = torch.arange(start, start + aux.shape[1], device=aux.device)[None]
        new = self.draft.context_kv(aux, pos)
        if self.kv is None:
            self.kv = new
        else:
            self.kv = [(torch.cat([k, nk], 2), torch.cat([v, nv], 2)) for (k, v), (nk, nv) in zip(self.kv, new)]

    def block_mask(self, anchor_pos: int) -> None:
        return None  # every cached position is committed and precedes the anchor


class StaticDraftContext:
    def __init__(self, draft: DSparkDraft, max_len: int, device: torch.device, dtype: torch.dtype):
        a = draft.arch
        self.draft, self.max_len = draft, max_len
        shape = (1, a.num_kv_heads, max_len, a.head_dim)
        self.kv: KV = [(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))
                       for _ in range(a.num_layers)]
        self._slots = torch.arange(max_len, device=device)  # (L,)
        self._block = torch.ones(a.block_size, dtype=torch.bool, device=device)  # (γ,)
        self.context_window = a.context_window  # W: slots p-W..p-1 only; 0: all below p

    def write(self, aux: torch.Tensor, positions: torch.Tensor) -> None:
        """aux: (1, T, m*D) captures at positions (T,), written in place. Writing a whole verify
        block (γ+1 slots) keeps the shape static; slots beyond the accepted ones stay hidden by
        `block_mask` until a later round overwrites them."""
        new = self.draft.context_kv(aux, positions[None])
        for (k, v), (nk, nv) in zip(self.kv, new):
            k.index_copy_(2, positions, nk.to(k.dtype))
            v.index_copy_(2, positions, nv.to(v.dtype))

    def window(self, w: int | None = None) -> KV:
        """The first w slots of every layer's K/V (views, no copy): what a round attends to."""
        return self.kv if w is None else [(k[:, :, :w], v[:, :, :w]) for k, v in self.kv]

    def block_mask(self, anchor_pos: torch.Tensor, w: int | None = None) -> torch.Tensor:
        """anchor_pos: () committed length p -> (1, 1, γ, W+γ) bool: slots < p among the first W
        (default all L), from p - context_window on when the draft has one, then the whole block."""
        slots = self._slots[:w]
        seen = slots < anchor_pos
        if self.context_window:
            seen = seen & (slots >= anchor_pos - self.context_window)
        row = torch.cat([seen, self._block])  # (W+γ,)
        return row.expand(self._block.shape[0], -1)[None, None]
