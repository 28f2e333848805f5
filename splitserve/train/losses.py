"""DSpark training losses (DSPARK.md, "Losses"), over the sampled block positions only.

Notation per valid block position i (slot k = 1..γ after its anchor):
    p_d   draft distribution (Markov-corrected), p_t target distribution at the same position
    alpha = 1 - 0.5 * ||p_d - p_t||_1        teacher-forced acceptance probability
    w_k   = exp(-(k-1)/g)                     position decay, each term normalised by sum(w);
                                              g = loss.decay_gamma, or per block size (config.decay_for)
    L_ce   = sum w_k * -log p_d(x*)           / sum w
    L_tv   = sum w_k * ||p_d - p_t||_1        / sum w
    L_conf = sum w_k * BCE(c_k, stopgrad(alpha)) / sum w
    L = 0.1 L_ce + 0.9 L_tv + 1.0 L_conf

The acceptance-aware "prefix" family (docs/losses.md) groups the rows of each block:
    P_k    = prod_{i<=k} alpha_i              prefix survival: tokens 1..k all accepted
    E[tau] = 1 + sum_k P_k                    expected acceptance length, bonus token included
and reweights CE/TV by P_{k-1} ("survival") or dE[tau]/d alpha_k ("gain") instead of w_k,
and/or adds L_acc = -E[tau]/γ; its distance term may be -2 log alpha (LK losses' negative log
acceptance) instead of TV, and P_k may be built from the greedy acceptance p_d(argmax p_t).

The "ttt" kind is EAGLE-3's (models/eagle3.py): a row is step j of a training-time test at one
position, its draft distribution p_d over the N draft-vocabulary tokens, p_t the target's over
all V tokens and p~_t = p_t renormalised on the draft vocabulary:
    L_kl = sum w_j * KL(p~_t || p_d)        / sum w      w_j = draft.ttt_decay^j
    L_ce = sum w_j * -log p_d(x*)           over rows whose x* is a draft token
    L_tv = sum w_j * ||p_d - p_t||_1        / sum w      (target mass off the draft vocabulary counts)
    L = kl_weight L_kl + ce_weight L_ce + tv_weight L_tv
alpha = 1 - ||p_d - p_t||_1 / 2 is then the chain's acceptance at step j, and E[tau] runs along
each position's steps as along a block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from splitserve.config import LossConfig, decay_for
from splitserve.models.vocab_map import VocabMap


@dataclass
class RowTerms:
    """What every loss needs from a row's two distributions, computed by `row_terms`."""

    ce: torch.Tensor  # (P,) -log p_d(x*)
    tv: torch.Tensor  # (P,) ||p_d - p_t||_1 in [0, 2]
    mass: torch.Tensor | None = None  # (P,) p_d(argmax p_t), where asked for
    kl: torch.Tensor | None = None  # (P,) KL(p~_t || p_d): ttt rows (ttt_row_terms)


@dataclass
class LossInputs:
    draft_logits: torch.Tensor | None  # (P, V), or (P, N) over `vocab`; None when `rows` is given
    target_logits: torch.Tensor | None  # (P, V), no grad; None when `rows` is given
    labels: torch.Tensor  # (P,) the data token x*
    slot: torch.Tensor  # (P,) k - 1, in 0..γ-1
    conf_logits: torch.Tensor | None  # (P,)
    block_size: int
    # (P,) which block each row belongs to (any ids; equal within a block). The prefix family
    # needs it to take products along a block; the paper loss does not.
    block: torch.Tensor | None = None
    # The row terms computed already (train/step.py computes them a chunk of rows at a time, so
    # the (P, V) logits never exist at once); then the logits above are not read.
    rows: RowTerms | None = None
    # (P,) each row's weight where the caller sets it (ttt: draft.ttt_decay^j); None: the position decay
    row_weight: torch.Tensor | None = None
    # a reduced draft vocabulary: draft_logits are (P, N) over it (row_terms)
    vocab: VocabMap | None = None


@dataclass
class LossOut:
    total: torch.Tensor
    ce: torch.Tensor
    tv: torch.Tensor
    conf: torch.Tensor
    alpha: torch.Tensor  # (P,) detached teacher-forced acceptance, for metrics
    # detached mean over blocks of the teacher-forced E[tau]; None without block ids
    exp_len: torch.Tensor | None = None

    def metrics(self) -> dict[str, float]:
        m = {
            "loss": float(self.total.detach()),
            "ce": float(self.ce),
            "tv": float(self.tv),
            "conf": float(self.conf),
            "alpha": float(self.alpha.mean()) if self.alpha.numel() else 0.0,
        }
        if self.exp_len is not None:
            m["tau_tf"] = float(self.exp_len)
        return m


def decay_weights(slot: torch.Tensor, g: float) -> torch.Tensor:
    """slot: (P,) 0-based -> w: (P,) = exp(-slot/g)."""
    return torch.exp(-slot.float() / g)


def _up(t: torch.Tensor) -> torch.Tensor:
    """At least fp32 (bf16 logits are upcast; fp64 stays fp64 for gradient checks)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def row_terms(draft_logits: torch.Tensor, target_logits: torch.Tensor, labels: torch.Tensor,
              greedy: bool = False, vocab: VocabMap | None = None) -> RowTerms:
    """(P, V) draft and target logits, (P,) labels -> ce = -log p_d(x*), tv = ||p_d - p_t||_1 and,
    when asked for, mass = p_d(argmax p_t): the draft's probability of the token greedy
    verification commits. Each row's terms depend on that row alone.

    `vocab`: the draft's logits are (P, N) over a reduced vocabulary (models/vocab_map.py) and p_d
    is zero off it: tv counts the target's mass there, mass is 0 where the target's argmax lies
    there, and ce is 0 at a row whose x* lies there (the draft cannot propose it)."""
    logp_d = F.log_softmax(_up(draft_logits), dim=-1)  # (P, N)
    p_d = logp_d.exp()
    p_t = F.softmax(_up(target_logits), dim=-1)  # (P, V)
    best = target_logits.argmax(-1) if greedy else None  # (P,) the token greedy verification commits
    if vocab is None:
        tv = (p_d - p_t).abs().sum(-1)  # (P,)
        ce = -logp_d.gather(-1, labels[:, None]).squeeze(-1)
        mass = p_d.gather(-1, best[:, None]).squeeze(-1) if greedy else None
        return RowTerms(ce, tv, mass)
    tv = _tv_on_vocab(p_d, p_t[:, vocab.used])
    ce = _ce_on_vocab(logp_d, vocab.to_draft(labels))
    mass = None
    if greedy:
        d = vocab.to_draft(best)  # (P,) -1 off the vocabulary
        mass = p_d.gather(-1, d.clamp_min(0)[:, None]).squeeze(-1) * (d >= 0)
    return RowTerms(ce, tv, mass)


def _tv_on_vocab(p_d: torch.Tensor, p_t: torch.Tensor) -> torch.Tensor:
    """p_d (P, N) the draft's distribution, p_t (P, N) the target's probabilities of those N
    tokens (normalised over its whole vocabulary) -> (P,) ||p_d - p_t||_1 over the whole vocabulary:
    the target's mass off the N tokens counts once."""
    off_vocab = (1.0 - p_t.sum(-1)).clamp_min(0.0)  # (P,)
    return (p_d - p_t).abs().sum(-1) + off_vocab


def _ce_on_vocab(logp_d: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """logp_d (P, N), labels (P,) draft ids, -1 off the vocabulary -> (P,) -log p_d(x*), 0 at -1."""
    return -logp_d.gather(-1, labels.clamp_min(0)[:, None]).squeeze(-1) * (labels >= 0)


def _row_terms(x: LossInputs, greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """-> ce (P,), tv (P,), mass (P,) or None: x.rows where given, else row_terms of the logits."""
    rows = x.rows if x.rows is not None else row_terms(x.draft_logits, x.target_logits, x.labels, greedy, x.vocab)
    if greedy and rows.mass is None:
        raise ValueError("this loss needs RowTerms.mass (the greedy acceptance): compute the rows with greedy=True")
    return rows.ce, rows.tv, rows.mass if greedy else None


def _conf_term(x: LossInputs, alpha: torch.Tensor, w: torch.Tensor, wsum: torch.Tensor) -> torch.Tensor:
    """Soft BCE of the confidence head against the detached alpha (P,), weighted by w (P,)."""
    if x.conf_logits is None:
        return torch.zeros((), device=alpha.device)
    bce = F.binary_cross_entropy_with_logits(_up(x.conf_logits), alpha.to(_up(x.conf_logits).dtype), reduction="none")
    return (w * bce).sum() / wsum


def paper_loss(x: LossInputs, cfg: LossConfig) -> LossOut:
    ce, tv, _ = _row_terms(x)
    alpha = (1.0 - 0.5 * tv).detach()

    w = decay_weights(x.slot, decay_for(cfg, x.block_size)).to(tv.dtype)
    wsum = w.sum().clamp_min(1e-8)
    l_ce = (w * ce).sum() / wsum
    l_tv = (w * tv).sum() / wsum
    l_conf = _conf_term(x, alpha, w, wsum)
    total = cfg.ce_weight * l_ce + cfg.tv_weight * l_tv + cfg.conf_weight * l_conf
    return LossOut(total=total, ce=l_ce.detach(), tv=l_tv.detach(), conf=l_conf.detach(), alpha=alpha)


# --------------------------------------------------------------------------- the prefix family


@dataclass
class BlockGrid:
    """The P rows laid out on a (NB, γ) grid, one line per block: row r sits at (index[r], slot[r])."""

    index: torch.Tensor  # (P,) compact block index in 0..NB-1
    slot: torch.Tensor  # (P,) 0..γ-1
    valid: torch.Tensor  # (NB, γ) bool: the cell holds a row

    @classmethod
    def of(cls, x: LossInputs) -> BlockGrid:
        if x.block is None:
            raise ValueError("the prefix losses need LossInputs.block (the block each row belongs to)")
        _, index = torch.unique(x.block, return_inverse=True)  # (P,)
        nb = int(index.max()) + 1 if index.numel() else 0
        valid = torch.zeros(nb, x.block_size, dtype=torch.bool, device=index.device)
        valid[index, x.slot] = True
        if int(valid.sum()) != index.numel():
            raise ValueError("two rows share one (block, slot) cell")
        return cls(index, x.slot, valid)

    def scatter(self, v: torch.Tensor, fill: float) -> torch.Tensor:
        """v: (P,) -> (NB, γ), `fill` in empty cells; differentiable in v."""
        grid = torch.full(self.valid.shape, fill, dtype=v.dtype, device=v.device)
        return grid.index_put((self.index, self.slot), v)

    def gather(self, grid: torch.Tensor) -> torch.Tensor:
        """(NB, γ) -> (P,)."""
        return grid[self.index, self.slot]


# In the functions below `a` is alpha on the grid (NB, γ) with 1 in empty cells. A cell is empty
# when its slot predicts a token past the end of the sequence (the block is shorter than γ) or
# an untrained token: it multiplies the survival by 1 and adds no P_k term, so a short block is
# exactly a block of its own length.


def expected_length(a: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """-> (NB,) E[tau] = 1 + sum_k P_k over the block's rows, P_k = prod_{i<=k} a_i."""
    return 1.0 + (torch.cumprod(a, dim=-1) * valid).sum(-1)


def survival_before(a: torch.Tensor) -> torch.Tensor:
    """-> (NB, γ) P_{k-1} = prod_{i<k} a_i (1 at the first slot): the chance slot k is reached."""
    return torch.cumprod(torch.cat([torch.ones_like(a[:, :1]), a[:, :-1]], dim=-1), dim=-1)


def acceptance_gain(a: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """-> (NB, γ) dE[tau]/d a_k = P_{k-1} * R_k, R_k = sum_{j>=k, valid} prod_{k<i<=j} a_i.

    R_k counts the tokens slot k unlocks: itself plus every later token that survives. Built
    right to left with R_k = valid_k + a_{k+1} R_{k+1}, so there is no division by a_k.
    """
    g = a.shape[-1]
    r = torch.zeros_like(a)
    acc = torch.zeros_like(a[:, 0])  # R_{k+1}
    for k in reversed(range(g)):
        nxt = a[:, k + 1] * acc if k + 1 < g else acc
        acc = valid[:, k].to(a.dtype) + nxt
        r[:, k] = acc
    return survival_before(a) * r


def prefix_loss(x: LossInputs, cfg: LossConfig) -> LossOut:
    """The paper's terms with acceptance-aware CE/TV weights, plus acc_weight * (-E[tau]/γ)."""
    ce, tv, greedy = _row_terms(x, greedy=cfg.acceptance == "greedy")
    alpha = 1.0 - 0.5 * tv  # (P,), differentiable: L_acc needs its gradient
    accept = greedy if cfg.acceptance == "greedy" else alpha  # what P_k is a product of
    grid = BlockGrid.of(x)
    a = grid.scatter(accept, fill=1.0)  # (NB, γ)
    exp_len = expected_length(a, grid.valid)  # (NB,)
    # log_accept: -2 log alpha; alpha is floored so a slot with no overlap at all stays finite
    dist = -2.0 * torch.log(alpha.clamp_min(1e-6)) if cfg.distance == "log_accept" else tv

    decay = decay_weights(x.slot, decay_for(cfg, x.block_size)).to(tv.dtype)
    # Weights are constants (computed from a detached alpha). With a gradient through them,
    # lowering w_k = P_{k-1} would itself lower the loss, i.e. the draft would be paid for
    # making the earlier slots worse. Detached, they only say where effort goes; raising the
    # survival itself is the job of the TV terms and of L_acc.
    if cfg.weighting == "decay":
        w = decay
    elif cfg.weighting == "survival":
        w = grid.gather(survival_before(a.detach()))
    else:  # gain
        w = grid.gather(acceptance_gain(a.detach(), grid.valid))
    wsum = w.sum().clamp_min(1e-8)
    l_ce = (w * ce).sum() / wsum
    l_tv = (w * dist).sum() / wsum
    # The confidence head must be calibrated at every slot (the scheduler multiplies them), so
    # its labels keep the paper's decay weights whatever the CE/TV weights are.
    l_conf = _conf_term(x, alpha.detach(), decay, decay.sum().clamp_min(1e-8))
    total = cfg.ce_weight * l_ce + cfg.tv_weight * l_tv + cfg.conf_weight * l_conf
    mean_len = exp_len.sum() / max(exp_len.numel(), 1)
    if cfg.acc_weight:
        total = total + cfg.acc_weight * (-mean_len / x.block_size)
    return LossOut(total=total, ce=l_ce.detach(), tv=l_tv.detach(), conf=l_conf.detach(),
                   alpha=alpha.detach(), exp_len=mean_len.detach())


# --------------------------------------------------------------------------- training-time test


def ttt_row_terms(draft_logits: torch.Tensor, target_logp: torch.Tensor, labels: torch.Tensor) -> RowTerms:
    """draft_logits: (P, N); target_logp: (P, N) log p_t of each draft-vocabulary token, normalised
    over the target's whole vocabulary; labels: (P,) draft ids of x*, -1 where x* is no draft
    token -> ce (0 at those rows), tv over the whole vocabulary, kl to the renormalised target."""
    logp_d = F.log_softmax(_up(draft_logits), dim=-1)  # (P, N)
    target_logp = _up(target_logp)
    tv = _tv_on_vocab(logp_d.exp(), target_logp.exp())
    logq = F.log_softmax(target_logp, dim=-1)  # p~_t
    kl = F.kl_div(logp_d, logq, reduction="none", log_target=True).sum(-1)
    return RowTerms(_ce_on_vocab(logp_d, labels), tv, None, kl)


def ttt_loss(x: LossInputs, cfg: LossConfig) -> LossOut:
    if x.rows is None or x.rows.kl is None or x.row_weight is None:
        raise ValueError("loss.kind=ttt needs ttt_row_terms rows and row weights (train/ttt.py computes them)")
    w = x.row_weight.to(x.rows.kl.dtype)
    wsum = w.sum().clamp_min(1e-8)
    in_vocab = (x.labels >= 0).to(w.dtype)
    l_kl = (w * x.rows.kl).sum() / wsum
    l_ce = (w * x.rows.ce).sum() / (w * in_vocab).sum().clamp_min(1e-8)
    l_tv = (w * x.rows.tv).sum() / wsum
    total = cfg.kl_weight * l_kl + cfg.ce_weight * l_ce + cfg.tv_weight * l_tv
    alpha = (1.0 - 0.5 * x.rows.tv).detach()
    return LossOut(total=total, ce=l_ce.detach(), tv=l_tv.detach(), conf=torch.zeros((), device=w.device),
                   alpha=alpha)


LOSSES = {"paper": paper_loss, "prefix": prefix_loss, "ttt": ttt_loss}
WEIGHTINGS = ("decay", "survival", "gain")
DISTANCES = ("tv", "log_accept")
ACCEPTANCES = ("tv", "greedy")


def compute_loss(x: LossInputs, cfg: LossConfig) -> LossOut:
    if cfg.kind not in LOSSES:
        raise ValueError(f"loss.kind must be one of {sorted(LOSSES)}, got {cfg.kind!r}")
    if cfg.weighting not in WEIGHTINGS:
        raise ValueError(f"loss.weighting must be one of {WEIGHTINGS}, got {cfg.weighting!r}")
    if cfg.distance not in DISTANCES:
        raise ValueError(f"loss.distance must be one of {DISTANCES}, got {cfg.distance!r}")
    if cfg.acceptance not in ACCEPTANCES:
        raise ValueError(f"loss.acceptance must be one of {ACCEPTANCES}, got {cfg.acceptance!r}")
    if cfg.kind in ("paper", "ttt") and (cfg.weighting != "decay" or cfg.acc_weight or cfg.distance != "tv"
                                         or cfg.acceptance != "tv"):
        raise ValueError(f"loss.kind={cfg.kind} is a fixed recipe; weighting, acc_weight, distance and "
                         "acceptance need loss.kind=prefix (e.g. loss=prefix or loss=expected_length)")
    if cfg.kind != "ttt" and cfg.kl_weight:
        raise ValueError("loss.kl_weight weighs the training-time-test KL of loss.kind=ttt (draft=eagle3)")
    out = LOSSES[cfg.kind](x, cfg)
    if out.exp_len is None and x.block is not None:
        # Log the teacher-forced E[tau] for every kind, so ablations compare on one number.
        grid = BlockGrid.of(x)
        exp_len = expected_length(grid.scatter(out.alpha, fill=1.0), grid.valid)
        out.exp_len = exp_len.sum() / max(exp_len.numel(), 1)
    return out
