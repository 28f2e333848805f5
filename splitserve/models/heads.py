"""The sequential stage on top of the parallel backbone: Markov head and confidence head.

Markov head (DSPARK.md): p_k(v | x0, x<k) = softmax(U_k + B_k)(v) with a low-rank bigram bias
B(x_{k-1}, .) = W1[x_{k-1}] W2. Training is teacher-forced (all k in parallel); inference is
sequential over k but only costs γ small (r x V) products, never a backbone recompute.
"""

from __future__ import annotations

import torch
from torch import nn

MARKOV_TYPES = ("vanilla", "gated")


class MarkovHead(nn.Module):
    """B_k = W2 z_k with z_k = W1[x_{k-1}] (vanilla) or gated by [h_k ; W1 x_{k-1}] (gated)."""

    def __init__(self, vocab_size: int, rank: int, hidden_size: int, kind: str = "vanilla"):
        super().__init__()
        if kind not in MARKOV_TYPES:
            raise ValueError(f"markov_head_type must be one of {MARKOV_TYPES}, got {kind!r}")
        self.kind = kind
        self.w1 = nn.Embedding(vocab_size, rank)
        self.w2 = nn.Linear(rank, vocab_size, bias=False)
        # W2 = 0 at init: an untrained DSpark drafts exactly like its DFlash backbone.
        nn.init.zeros_(self.w2.weight)
        nn.init.normal_(self.w1.weight, std=0.02)
        self.gate = nn.Linear(hidden_size + rank, rank) if kind == "gated" else None

    def features(self, prev_ids: torch.Tensor) -> torch.Tensor:
        """prev_ids: (...) -> W1[prev]: (..., r)."""
        return self.w1(prev_ids)

    def bias(self, prev_ids: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """prev_ids: (...), h: (..., D) -> B: (..., V)."""
        z = self.w1(prev_ids)
        if self.gate is not None:
            z = z * torch.sigmoid(self.gate(torch.cat([h, z], dim=-1)))
        return self.w2(z)


class ConfidenceHead(nn.Module):
    """c_k = sigmoid(w^T [h_k ; W1[x_{k-1}]] + b): P(token k accepted | 1..k-1 accepted)."""

    def __init__(self, hidden_size: int, markov_rank: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size + markov_rank, 1)

    def forward(self, h: torch.Tensor, markov_features: torch.Tensor | None) -> torch.Tensor:
        """h: (..., D), markov_features: (..., r) or None -> logit of c_k: (...)."""
        x = h if markov_features is None else torch.cat([h, markov_features], dim=-1)
        return self.proj(x).squeeze(-1)
