"""DSpark training losses (DSPARK.md, "Losses"), over the sampled block positions only.

Notation per valid block position i (slot k = 1..γ after its anchor):
    p_d   draft distribution (Markov-corrected), p_t target distribution at the same position
    alpha = 1 - 0.5 * ||p_d - p_t||_1        teacher-forced acceptance probability
    w_k   = exp(-(k-1)/g)                     position decay, each term normalised by sum(w)
    L_ce   = sum w_k * -log p_d(x*)           / sum w
    L_tv   = sum w_k * ||p_d - p_t||_1        / sum w
    L_conf = sum w_k * BCE(c_k, stopgrad(alpha)) / sum w
    L = 0.1 L_ce + 0.9 L_tv + 1.0 L_conf
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from splitserve.config import LossConfig


@dataclass
class LossInputs:
    draft_logits: torch.Tensor  # (P, V)
    target_logits: torch.Tensor  # (P, V), no grad
    labels: torch.Tensor  # (P,) the data token x*
    slot: torch.Tensor  # (P,) k - 1, in 0..γ-1
    conf_logits: torch.Tensor | None  # (P,)
    block_size: int


@dataclass
class LossOut:
    total: torch.Tensor
    ce: torch.Tensor
    tv: torch.Tensor
    conf: torch.Tensor
    alpha: torch.Tensor  # (P,) detached teacher-forced acceptance, for metrics

    def metrics(self) -> dict[str, float]:
        return {
            "loss": float(self.total.detach()),
            "ce": float(self.ce),
            "tv": float(self.tv),
            "conf": float(self.conf),
            "alpha": float(self.alpha.mean()) if self.alpha.numel() else 0.0,
        }


def decay_weights(slot: torch.Tensor, g: float) -> torch.Tensor:
    """slot: (P,) 0-based -> w: (P,) = exp(-slot/g)."""
    return torch.exp(-slot.float() / g)


def _up(t: torch.Tensor) -> torch.Tensor:
    """At least fp32 (bf16 logits are upcast; fp64 stays fp64 for gradient checks)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def paper_loss(x: LossInputs, cfg: LossConfig) -> LossOut:
    logp_d = F.log_softmax(_up(x.draft_logits), dim=-1)  # (P, V)
    p_d = logp_d.exp()
    p_t = F.softmax(_up(x.target_logits), dim=-1)
    tv = (p_d - p_t).abs().sum(-1)  # (P,) in [0, 2]
    alpha = (1.0 - 0.5 * tv).detach()
    ce = -logp_d.gather(-1, x.labels[:, None]).squeeze(-1)

    w = decay_weights(x.slot, cfg.decay_gamma).to(tv.dtype)
    wsum = w.sum().clamp_min(1e-8)
    l_ce = (w * ce).sum() / wsum
    l_tv = (w * tv).sum() / wsum
    if x.conf_logits is not None:
        bce = F.binary_cross_entropy_with_logits(_up(x.conf_logits), alpha.to(_up(x.conf_logits).dtype), reduction="none")
        l_conf = (w * bce).sum() / wsum
    else:
        l_conf = torch.zeros((), device=tv.device)
    total = cfg.ce_weight * l_ce + cfg.tv_weight * l_tv + cfg.conf_weight * l_conf
    return LossOut(total=total, ce=l_ce.detach(), tv=l_tv.detach(), conf=l_conf.detach(), alpha=alpha)


LOSSES = {"paper": paper_loss}


def compute_loss(x: LossInputs, cfg: LossConfig) -> LossOut:
    if cfg.kind not in LOSSES:
        raise ValueError(f"loss.kind must be one of {sorted(LOSSES)}, got {cfg.kind!r}")
    return LOSSES[cfg.kind](x, cfg)
