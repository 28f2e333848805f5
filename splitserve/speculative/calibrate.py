"""Sequential Temperature Scaling (STS) of the confidence head: pure functions on tensors.

The head predicts c_k = P(draft token k accepted | tokens 1..k-1 accepted). What a verify
scheduler consumes is the prefix survival a_j = prod_{i<=j} c_i, the predicted probability that
the first j draft tokens are all accepted. Calibration is judged on that product against the
observed prefix event y_j = 1[n >= j] (n = accepted draft tokens in the round).

STS (DSPARK.md): scale each position's logit by its own temperature, c_k(T) = sigmoid(z_k / T_k),
and fit T_1..T_γ left to right: with T_1..T_{j-1} fixed, T_j is the grid value minimising the
ECE of a_j against y_j. One scalar per position, so the fit needs few observations.

Glossary: N verification rounds, γ block size, G grid size.
"""

from __future__ import annotations

import torch


def ece(confidence: torch.Tensor, outcome: torch.Tensor, n_bins: int = 10) -> float:
    """Expected calibration error with equal-width bins on [0, 1].

    confidence (N,) predicted probabilities, outcome (N,) observed 0/1 events ->
    sum_b |B_b| / N * |mean(confidence in b) - mean(outcome in b)|.
    """
    confidence, outcome = confidence.double().flatten(), outcome.double().flatten()
    if confidence.numel() == 0:
        return 0.0
    bins = (confidence * n_bins).long().clamp(0, n_bins - 1)  # (N,); conf == 1 goes to the last bin
    conf_sum = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, bins, confidence)
    out_sum = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, bins, outcome)
    # |sum conf - sum outcome| / N per bin is |B|/N * |mean gap|, and empty bins add nothing.
    return float((conf_sum - out_sum).abs().sum() / confidence.numel())


def prefix_acceptance(accepts: torch.Tensor, gamma: int) -> torch.Tensor:
    """accepts (N,) accepted draft tokens per round -> y (N, γ), y[:, j-1] = 1[n >= j]."""
    k = torch.arange(1, gamma + 1, device=accepts.device)
    return (accepts[:, None] >= k[None]).float()


def survival(logits: torch.Tensor, temperatures: torch.Tensor | None = None) -> torch.Tensor:
    """logits (N, γ) of c_k, temperatures (γ,) or None (all 1) -> a (N, γ) = cumprod_k sigmoid(z_k / T_k)."""
    if temperatures is not None:
        logits = logits / temperatures.to(logits)[None]
    return torch.sigmoid(logits.double()).cumprod(-1)


def survival_ece(
    logits: torch.Tensor, accepts: torch.Tensor, temperatures: torch.Tensor | None = None, n_bins: int = 10
) -> tuple[float, list[float]]:
    """-> (ECE pooled over all N·γ (round, position) pairs, ECE per position j = 1..γ)."""
    a = survival(logits, temperatures)  # (N, γ)
    y = prefix_acceptance(accepts, logits.shape[-1])  # (N, γ)
    per_pos = [ece(a[:, j], y[:, j], n_bins) for j in range(a.shape[-1])]
    return ece(a, y, n_bins), per_pos


def default_grid() -> torch.Tensor:
    """(G,) temperatures from 0.05 to 20, log-spaced (5% steps), with 1.0 exactly among them."""
    return torch.cat([torch.logspace(-1.3, 1.3, 121, dtype=torch.float64), torch.ones(1, dtype=torch.float64)])


def fit_sts(
    logits: torch.Tensor, accepts: torch.Tensor, grid: torch.Tensor | None = None, n_bins: int = 10
) -> torch.Tensor:
    """Fit one temperature per block position, left to right.

    logits (N, γ) confidence-head logits of each round, accepts (N,) accepted draft tokens
    -> temperatures (γ,). Ties (e.g. a position nobody reaches) keep the value closest to 1.
    """
    grid = (default_grid() if grid is None else grid).double()  # (G,)
    n, gamma = logits.shape
    y = prefix_acceptance(accepts, gamma)  # (N, γ)
    temps = torch.ones(gamma, dtype=torch.float64)
    prev = torch.ones(n, dtype=torch.float64)  # a_{j-1} under the temperatures fitted so far
    for j in range(gamma):
        cand = prev[None] * torch.sigmoid(logits[:, j].double()[None] / grid[:, None])  # (G, N)
        errs = torch.tensor([ece(c, y[:, j], n_bins) for c in cand])  # (G,)
        near_best = errs <= errs.min() + 1e-12
        best = torch.where(near_best, grid.log().abs(), torch.inf).argmin()
        temps[j] = grid[best]
        prev = cand[best]
    return temps
