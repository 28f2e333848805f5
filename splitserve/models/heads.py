"""The sequential stage on top of the parallel backbone: Markov head and confidence head.

Markov head (DSPARK.md): p_k(v | x0, x<k) = softmax(U_k + B_k)(v) with a low-rank bigram bias
B(x_{k-1}, .) = W1[x_{k-1}] W2. Training is teacher-forced (all k in parallel); inference is
sequential over k but only costs γ small (r x V) products, never a backbone recompute.
"""

from __future__ import annotations

import torch
from torch import nn

MARKOV_TYPES = ("vanilla", "gated", "rnn")


class MarkovHead(nn.Module):
    """B_k = W2 z_k, z_k the head's r-dim latent for position k of a block:

    vanilla  z_k = W1[x_{k-1}]
    gated    z_k = W1[x_{k-1}] * sigmoid(W_g [h_k ; W1[x_{k-1}]] + b_g)
    rnn      a state s (r) carried along the block from s_0 = 0: with u = [s_{k-1} ; W1[x_{k-1}] ; h_k],
             (g, c, o) = split(W_j u + b_j), s_k = g * s_{k-1} + (1 - g) * c with g = sigmoid,
             c = tanh, and z_k = tanh(o). Position k then depends on every earlier token of its
             block, not only the one before (DSPARK.md "Variants").

    `latent` computes a whole teacher-forced block (training, export); `step` one position of
    a block being drafted (inference), carrying the rnn state. Both give the same z.
    """

    def __init__(self, vocab_size: int, rank: int, hidden_size: int, kind: str = "vanilla",
                 in_vocab: int | None = None):
        """vocab_size: the logits' width (W2's rows); in_vocab: the ids W1 reads (default the
        same). A draft over a reduced vocabulary of N tokens reads N + 1: its own ids and one row
        for every target token outside them (models/dspark.py, `head_ids`)."""
        super().__init__()
        if kind not in MARKOV_TYPES:
            raise ValueError(f"markov_head_type must be one of {MARKOV_TYPES}, got {kind!r}")
        self.kind, self.rank = kind, rank
        self.w1 = nn.Embedding(in_vocab or vocab_size, rank)
        self.w2 = nn.Linear(rank, vocab_size, bias=False)
        # W2 = 0 at init: an untrained DSpark drafts exactly like its DFlash backbone.
        nn.init.zeros_(self.w2.weight)
        nn.init.normal_(self.w1.weight, std=0.02)
        self.gate = nn.Linear(hidden_size + rank, rank) if kind == "gated" else None
        self.joint = nn.Linear(2 * rank + hidden_size, 3 * rank) if kind == "rnn" else None

    def features(self, prev_ids: torch.Tensor) -> torch.Tensor:
        """prev_ids: (...) -> W1[prev]: (..., r)."""
        return self.w1(prev_ids)

    def init_state(self, like: torch.Tensor) -> torch.Tensor | None:
        """The rnn state s_0 = 0 for a batch shaped like `like` (..., D): (..., r); else None."""
        return like.new_zeros(*like.shape[:-1], self.rank) if self.joint is not None else None

    def step(
        self, state: torch.Tensor | None, prev_ids: torch.Tensor, h: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """One position. state: (..., r) or None, prev_ids: (...), h: (..., D) -> (state', z: (..., r))."""
        e = self.w1(prev_ids).to(h.dtype)
        if self.gate is not None:
            return state, e * torch.sigmoid(self.gate(torch.cat([h, e], dim=-1)))
        if self.joint is not None:
            g, c, o = self.joint(torch.cat([state, e, h], dim=-1)).chunk(3, dim=-1)
            g = torch.sigmoid(g)
            return g * state + (1 - g) * torch.tanh(c), torch.tanh(o)
        return state, e

    def latent(self, prev_ids: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """A teacher-forced block. prev_ids: (..., γ), h: (..., γ, D) -> z: (..., γ, r)."""
        if self.joint is None:  # no state: every position at once
            return self.step(None, prev_ids, h)[1]
        state, zs = self.init_state(h[..., 0, :]), []
        for k in range(h.shape[-2]):
            state, z = self.step(state, prev_ids[..., k], h[..., k, :])
            zs.append(z)
        return torch.stack(zs, dim=-2)


class ConfidenceHead(nn.Module):
    """c_k = sigmoid(w^T [h_k ; W1[x_{k-1}]] + b): P(token k accepted | 1..k-1 accepted)."""

    def __init__(self, hidden_size: int, markov_rank: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size + markov_rank, 1)

    def forward(self, h: torch.Tensor, markov_features: torch.Tensor | None) -> torch.Tensor:
        """h: (..., D), markov_features: (..., r) or None -> logit of c_k: (...)."""
        x = h if markov_features is None else torch.cat([h, markov_features], dim=-1)
        return self.proj(x).squeeze(-1)
