"""EAGLE-3's training: a k-step training-time test over every position of the batch.

Row (j, b, t): step j of the chain started after the target's position t of sequence b
(models/eagle3.py, Eagle3Draft.unroll). It predicts x*_{t+2+j}; the target's distribution for
that token comes from its final hidden state at t+1+j through its own lm_head, normalised over
the whole vocabulary and read on the draft vocabulary. A row is trained when its token is inside
the sequence and on a trained (loss-masked) token, as speculators does; earlier steps of the
same chain need not be. Loss: train/losses.py, kind "ttt", step j weighted by ttt_decay^j.

Before the first step `prepare` counts the trained tokens of the whole training set and gives
the draft its vocabulary (models/vocab_map.py); checkpoints keep it (d2t, t2d), so a resumed run
reads it back. Glossary: B batch, T tokens, U = T-1 positions, k steps, P rows, D hidden,
V target vocab, N draft vocab.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from splitserve.config import LossConfig, RunConfig
from splitserve.errors import UserError
from splitserve.target.sdpa import varlen_sdpa
from splitserve.train.losses import LossInputs, LossOut, RowTerms, compute_loss, ttt_row_terms
from splitserve.train.step import Batch
from splitserve.train.vocab import fit_vocab


@dataclass
class TTTPlan:
    valid: torch.Tensor  # (k, B, U) bool: row (j, b, t) is trained
    labels: torch.Tensor  # (k, B, U) target id of x*_{t+2+j} (clamped inside the sequence)


def plan_ttt(batch: Batch, steps: int) -> TTTPlan:
    """Which rows a batch trains; depends on the data only."""
    b, t = batch.input_ids.shape
    dev = batch.input_ids.device
    u = t - 1
    label_pos = (torch.arange(u, device=dev)[None, :] + 2 + torch.arange(steps, device=dev)[:, None])  # (k, U)
    inside = label_pos[:, None, :] < batch.lengths.to(dev)[None, :, None]  # (k, B, U)
    pos = label_pos.clamp(max=t - 1)[:, None, :].expand(steps, b, u)
    rows = torch.arange(b, device=dev)[None, :, None]
    return TTTPlan(valid=inside & batch.loss_mask[rows, pos].bool(), labels=batch.input_ids[rows, pos])


def step_weights(steps: torch.Tensor, decay: float) -> torch.Tensor:
    """steps: (P,) j -> (P,) decay^j."""
    return torch.pow(torch.full_like(steps, decay, dtype=torch.float32), steps.float())


@torch.no_grad()
def target_logprobs(draft, final: torch.Tensor, chunk_rows: int = 0) -> torch.Tensor:
    """final: (Q, D) the target's final hidden states -> (Q, N) log p_t of each draft-vocabulary
    token, normalised over all V (the target's logit transform applied), chunk_rows rows at a time
    (0: all at once). No gradient."""
    used = draft.vocab.used
    transform = getattr(draft, "target_logit_transform", None)
    out = []
    step = chunk_rows if chunk_rows > 0 else max(final.shape[0], 1)
    for s in range(0, final.shape[0], step):
        logits = draft.target_lm_head(final[s: s + step].to(draft.target_lm_head.weight.dtype))  # (q, V)
        logits = (transform(logits) if transform is not None else logits).float()
        out.append(logits[:, used] - torch.logsumexp(logits, dim=-1, keepdim=True))
    return torch.cat(out) if out else final.new_zeros(0, used.numel(), dtype=torch.float32)


def _row_terms(draft, h: torch.Tensor, target_logp: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
    t = ttt_row_terms(draft.draft_logits(h), target_logp, labels)
    return t.ce, t.tv, t.kl


def rows_of(draft, h: torch.Tensor, target_logp: torch.Tensor, labels: torch.Tensor, chunk_rows: int) -> RowTerms:
    """h: (P, D), target_logp: (P, N), labels: (P,) draft ids -> the rows' terms; chunk_rows > 0:
    that many rows at a time under activation checkpointing (as train/step.py chunked_row_terms),
    so the (P, N) draft logits never exist at once."""
    if chunk_rows <= 0:
        return ttt_row_terms(draft.draft_logits(h), target_logp, labels)
    parts = [checkpoint(_row_terms, draft, h[s: s + chunk_rows], target_logp[s: s + chunk_rows],
                        labels[s: s + chunk_rows], use_reentrant=False)
             for s in range(0, labels.numel(), chunk_rows)]
    ce, tv, kl = (torch.cat(c) for c in zip(*parts))
    return RowTerms(ce, tv, None, kl)


def ttt_draft_loss(draft, batch: Batch, plan: TTTPlan, loss_cfg: LossConfig, decay: float,
                   chunk_rows: int = 0) -> LossOut:
    steps, b, u = plan.valid.shape
    with varlen_sdpa():  # the sequence length changes every step (target/sdpa.py)
        h = torch.stack(draft.unroll(batch.aux, batch.input_ids, steps))  # (k, B, U, D)
    sel = plan.valid.nonzero(as_tuple=True)  # P rows (j, b, t)
    j, bi, ti = sel
    source = ti + 1 + j  # (P,) the target position whose distribution the row's token follows
    # Each target position serves up to k rows: its log-probabilities are computed once.
    t = batch.input_ids.shape[1]
    need = torch.zeros(b * t, dtype=torch.bool, device=h.device)
    need[bi * t + source] = True
    index = torch.cumsum(need.to(torch.long), 0) - 1  # (B*T,) compact row of each needed position
    final = batch.final.reshape(b * t, -1)[need]  # (Q, D)
    target_logp = target_logprobs(draft, final.to(h.dtype), chunk_rows)[index[bi * t + source]]  # (P, N)
    labels = draft.vocab.to_draft(plan.labels[sel])  # (P,) -1 off the draft vocabulary
    inputs = LossInputs(
        draft_logits=None,
        target_logits=None,
        rows=rows_of(draft, h[sel], target_logp, labels, chunk_rows),
        labels=labels,
        slot=j,
        conf_logits=None,
        block_size=steps,
        block=bi * u + ti,  # one chain per (sequence, position): E[tau] runs along its steps
        row_weight=step_weights(j, decay),
    )
    return compute_loss(inputs, loss_cfg)


class TTTObjective:
    """The training side of draft.family=eagle3 and mtp (train/objectives.py)."""

    def __init__(self, cfg: RunConfig):
        d = cfg.draft
        for key, value, ok in (("ttt_steps", d.ttt_steps, d.ttt_steps >= 1), ("ttt_decay", d.ttt_decay, d.ttt_decay > 0)):
            if not ok:
                raise UserError(f"draft.{key}={value}: must be positive")
        self.decay, self.loss_cfg, self.chunk_rows = d.ttt_decay, cfg.loss, cfg.train.loss_chunk_rows

    def prepare(self, draft, cfg: RunConfig, target, source) -> str | None:
        if not hasattr(draft, "set_vocab"):  # mtp: the target's own head drafts over its whole vocabulary
            return None
        return fit_vocab(draft, draft.arch.draft_vocab_size, cfg, target, source)

    def plan(self, draft, batch: Batch, generators) -> TTTPlan:
        return plan_ttt(batch, draft.arch.ttt_steps)

    def weight(self, plan: TTTPlan) -> float:
        per_step = plan.valid.sum(dim=(1, 2)).float()  # (k,)
        return float((per_step * step_weights(torch.arange(per_step.numel(), device=per_step.device), self.decay)).sum())

    def loss(self, draft, batch: Batch, plan: TTTPlan) -> LossOut:
        return ttt_draft_loss(draft, batch, plan, self.loss_cfg, self.decay, self.chunk_rows)
