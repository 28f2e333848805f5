"""Confidence-scheduled verification at batch 1: how many draft tokens to verify this round.

Pure device functions (no host sync), so they run inside a captured round. Notation as in
verify.py: d_1..d_γ draft tokens, q_0..q_γ the target's distributions at the verify positions.
c_k (γ,) is the confidence head's P(d_k accepted | d_1..d_{k-1} accepted), a_j = prod_{i<=j} c_i
the prefix survival, cost(k) the relative cost of verifying k+1 tokens (x_p, d_1..d_k).

Rule: a window of L draft tokens commits 1 + sum_{j<=L} a_j tokens in expectation (the 1 is the
bonus), at cost(L). Candidates L = 1, 2, ... are admitted in order while the rate
(1 + sum_{j<=L} a_j) / cost(L) improves, stopping at the first non-improvement.

Why this stays lossless. Greedy: any truncation is exact, since every committed token is an
argmax of the target. Sampling: c_k is a function of the draft's hidden state h_k (the context
and the anchor only) and of d_{k-1}, never of d_k, d_{k+1}, ... nor of the target. Because of
the early stop, the event {L >= k} depends on a_1..a_k only, i.e. on d_1..d_{k-1}: whether d_k
is verified is decided before d_k is looked at. Conditional on reaching position k, d_k is then
still distributed as p_k, the usual accept/residual argument gives a token distributed as q_{k-1},
and at the stop the next token is drawn from q_L itself. So the round is ordinary speculative
sampling with a draft of length L chosen by a stopping rule, whose output follows the target.
(A global argmax over L would look at a_{L+1}.., which depend on d_L: that is not allowed.)
"""

from __future__ import annotations

import torch

from splitserve.speculative.verify import at, race_draw, target_probs

SCHEDULES = ("static", "confidence")


def linear_cost(gamma: int, beta: float) -> list[float]:
    """cost(k) = 1 + beta * k for k = 0..γ: the relative cost of verifying k+1 tokens."""
    return [1.0 + beta * k for k in range(gamma + 1)]


def prefix_survival(conf: torch.Tensor, temperatures: torch.Tensor | None = None) -> torch.Tensor:
    """conf (γ,) c_k in (0, 1), temperatures (γ,) STS or None -> a (γ,) float32, a_j = prod_{i<=j} c_i(T_i).

    STS scales each position's logit: c_k(T) = sigmoid(logit(c_k) / T_k)."""
    c = conf.float()
    if temperatures is not None:
        c = torch.sigmoid(torch.logit(c, eps=1e-6) / temperatures)
    return c.cumprod(0)


def choose_prefix(survival: torch.Tensor, cost: torch.Tensor) -> torch.Tensor:
    """survival (γ,) a_1..a_γ, cost (γ+1,) cost(0..γ) -> L () long in 0..γ.

    L is the last candidate of the improving run: rate(j) > rate(j-1) for every j <= L."""
    expected = torch.cat([survival.new_ones(1), 1 + survival.cumsum(0)])  # (γ+1,): 1 + sum_{j<=L} a_j
    rate = expected / cost  # (γ+1,)
    improves = (rate[1:] > rate[:-1]).long()  # (γ,): candidate j beats j-1
    return improves.cumprod(0).sum()


def truncate_verify(
    n: torch.Tensor,
    nxt: torch.Tensor,
    limit: torch.Tensor,
    target_logits: torch.Tensor,
    temperature: float,
    generator: torch.Generator | None = None,
    top_k: int = 0,
    top_p: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn a full-block verification into one of the prefix d_1..d_L (L = `limit`).

    n (), nxt (): verify_block's result over all γ; target_logits (γ+1, V).
    -> (min(n, L) (), next token ()). The accept tests of d_1..d_L are the same in both, so:
    n < L: the first rejection is inside the prefix, (n, nxt) stand (the residual draw at n).
    n >= L: all of d_1..d_L passed and the window ends there; the next token comes from q_L
    (greedy: argmax q_L; sampling: a fresh exponential-race draw from softmax(logits_L / T)).
    Sampling draws its (V,) noise whether or not it is used, so the generator advances the same
    way every round (CUDA graphs replay a fixed sequence of draws).
    """
    row = at(target_logits, limit)  # (V,): logits of q_L
    if temperature > 0:
        q = target_probs(row, temperature, top_k, top_p)  # the same truncated q as verify_block
        at_stop = race_draw(q, generator)
    else:
        at_stop = row.argmax()
    past = n >= limit  # () bool: the window closed at L with everything in it accepted
    return torch.minimum(n, limit), torch.where(past, at_stop, nxt)
