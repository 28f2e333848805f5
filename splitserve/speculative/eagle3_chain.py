"""The chain drafters (the seam of drafter.py): chains of γ steps over the draft's own KV cache.

They serve every chain draft (`drafting = "chain"`): EAGLE-3 (models/eagle3.py) and the target's
own MTP head (models/mtp.py). What they ask of it: fuse, backbone(..., step=j), draft_logits,
vocab. Below, "the draft" is either; EAGLE-3's words (g_t, its fused state) read as MTP's h_t.

Entry t of the draft's cache is the draft reading the target's fused state g_t at position t
with the token x_{t+1} that followed it, at RoPE position t+1; its output h_t predicts x_{t+2}
(models/eagle3.py). Between rounds, for committed tokens x_0..x_p (x_p the anchor):
    cache   entries 0..p-1, every one read from the target's own state (the last, p-1, reads the anchor)
    h0      (1, 1, D) entry p-1's output: step 0 of the next chain
A round:
    propose  d_1 from h0; step j = 1..γ-1 reads d_j with step j-1's state (the draft's own, in
             place of a target state the target has not computed) at cache slot p-1+j, RoPE
             position p+j, and predicts d_{j+1}. Entries p..p+γ-2 are the chain's own.
    commit   the chain's entries are dropped; the verify's captures g_p..g_{p+n} are read with the
             committed tokens [d_1..d_n, bonus] at slots p..p+n, and the output at p+n (the one
             that read the bonus, the next anchor) is the next h0.
So the draft extends its cache with the committed positions each round and forgets the rejected
ones, as the target does, and every entry it keeps was computed from the target's states: what
training's test-time unroll saw (step 0 reads the target, later steps the draft).

Reference flavour (decode.py): an Eagle3Cache cropped to p and extended by the n+1 committed rows.
Engine flavour: a preallocated cache, slot = position. The commit reads all γ+1 verify rows at
fixed shape and gathers h0 at row n on the device. No crop is needed: every query sees only the
slots at or below its own, rows past n sit at slots the next round rewrites (its chain at p'..,
its commit at p'..p'+γ) before any query at or above them reads them, and the slots below p' are
all committed. Glossary: γ chain length, D hidden, N draft vocab, V target vocab, L capacity,
W attention window, Q rows read at once.
"""

from __future__ import annotations

import torch

from splitserve.models.eagle3 import Eagle3Cache
from splitserve.models.finite import finite_or_zero


class Eagle3Chain:
    """The chain both flavours draft; `_read` (their cache's forward) is what differs. `draft`:
    any chain draft (Eagle3Draft, MtpDraft)."""

    h0: torch.Tensor  # (1, 1, D)

    def __init__(self, draft):
        self.draft, self.gamma = draft, draft.arch.block_size
        self.vocab_size = draft.arch.vocab_size
        self.used = draft.vocab.used  # (N,) the target id of each draft id

    def _read(self, hidden: torch.Tensor, token_ids: torch.Tensor, start, window: int | None,
              step: int = 0) -> torch.Tensor:
        """hidden (1, Q, D), token_ids (1, Q) as entries start..start+Q-1, read by chain step
        `step` (0: from the target's states) -> h (1, Q, D)."""
        raise NotImplementedError

    def propose(self, anchor, p, temperature=0.0, generator=None, window=None):
        """-> tokens (γ,) target ids, their distributions (γ, V) at T>0 else None, no confidences.
        `anchor` is already in the cache (the commit read it), so only p is needed."""
        h, tokens, probs = self.h0, [], []
        for j in range(self.gamma):
            if j:  # step j: d_j with step j-1's state, entry p-1+j
                h = self._read(h, tokens[-1].view(1, 1), p + j - 1, window, step=j)
            token, prob = self._pick(self.draft.draft_logits(h[0, -1]), temperature, generator)
            tokens.append(token)
            probs.append(prob)
        return torch.cat(tokens), (torch.stack(probs) if temperature > 0 else None), None

    def _pick(self, logits: torch.Tensor, temperature: float, generator) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logits (N,) over the draft vocabulary -> the target id (1,) and, at T>0, the
        distribution it was drawn from over the target vocabulary (V,): zero outside the draft's
        N ids, so the rejection rule stays lossless (those tokens come only from the residual)."""
        if temperature <= 0:
            return self.used.index_select(0, logits.argmax(-1, keepdim=True)), None
        (logits,) = finite_or_zero(logits)  # a draw needs a finite distribution (models/finite.py)
        p = torch.softmax(logits.float() / temperature, dim=-1)  # (N,)
        i = torch.multinomial(p, 1, generator=generator)  # (1,)
        return self.used.index_select(0, i), p.new_zeros(self.vocab_size).index_copy_(0, self.used, p)


class Eagle3ReferenceDrafter(Eagle3Chain):
    """One request of the reference loop: the cache holds exactly entries 0..p-1 between rounds."""

    def __init__(self, draft):
        super().__init__(draft)
        self.cache = Eagle3Cache()

    def _read(self, hidden, token_ids, start, window=None, step=0):
        assert self.cache.length == start, (self.cache.length, start)
        positions = torch.arange(start + 1, start + 1 + token_ids.shape[1], device=token_ids.device)[None]
        return self.draft.backbone(hidden, token_ids, positions, self.cache, step=step)

    def commit(self, aux, start, tokens, n, window=None) -> None:
        self.cache.crop(start)  # the chain's own entries, read from draft states
        h = self._read(self.draft.fuse(aux[:, : n + 1]), tokens[: n + 1].view(1, -1), start)  # (1, n+1, D)
        self.h0 = h[:, -1:]


class StaticEagle3Cache:
    """Eagle3Cache's interface over preallocated per-layer K/V, (1, H, L, ·) each, slot =
    position. `bind` says where the next forward writes and returns its mask; `append` writes
    there in place and hands the attention the first W slots (views, no copy). A layer's buffers
    take the shapes of its first append (the prefill's commit, never inside a CUDA graph capture,
    whose warm-up runs eagerly): keys and values may differ in width (MLA caches its latent and
    its RoPE part), so nothing is assumed of the draft's attention."""

    def __init__(self, capacity: int, device: torch.device, dtype: torch.dtype):
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.device, self.dtype = device, dtype
        self.capacity = capacity
        self._slots = torch.arange(capacity, device=device)  # (L,)
        self.slots, self.window = self._slots[:1], capacity

    def bind(self, slots: torch.Tensor, window: int | None) -> torch.Tensor:
        """slots (Q,) the entries the next forward writes -> its mask (1, 1, Q, W): key slot <= query slot."""
        self.slots, self.window = slots, window or self.capacity
        return (self._slots[None, : self.window] <= slots[:, None])[None, None]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v: (1, H, Q, ·) -> the layer's first W slots, (1, H, W, ·), these written in."""
        if layer not in self.kv:
            self.kv[layer] = tuple(torch.zeros((*x.shape[:2], self.capacity, x.shape[-1]), device=self.device,
                                               dtype=self.dtype) for x in (k, v))
        cache_k, cache_v = self.kv[layer]
        cache_k.index_copy_(2, self.slots, k.to(cache_k.dtype))
        cache_v.index_copy_(2, self.slots, v.to(cache_v.dtype))
        return cache_k[:, :, : self.window], cache_v[:, :, : self.window]


class Eagle3EngineDrafter(Eagle3Chain):
    """The engine's drafter: fixed shapes, positions on the device, no host read."""

    def __init__(self, draft, capacity: int, device: torch.device, dtype: torch.dtype):
        super().__init__(draft)
        self.cache = StaticEagle3Cache(capacity, device, dtype)
        self.h0 = torch.zeros(1, 1, draft.arch.hidden_size, device=device, dtype=dtype)
        self._rows = torch.arange(capacity, device=device)  # (L,)

    def _read(self, hidden, token_ids, start, window=None, step=0):
        slots = start + self._rows[: token_ids.shape[1]]  # (Q,)
        mask = self.cache.bind(slots, window)
        return self.draft.backbone(hidden, token_ids, (slots + 1)[None], self.cache, mask, step=step)

    def commit(self, aux, start, tokens, n, window=None) -> None:
        h = self._read(self.draft.fuse(aux), tokens.view(1, -1), start, window)  # (1, T, D)
        row = n.view(1) if torch.is_tensor(n) else torch.tensor([n], device=h.device)
        self.h0.copy_(h.index_select(1, row))
