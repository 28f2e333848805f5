"""How each draft family turns a training batch into its loss: the training side of the family
seam (models/families.py), keyed by the same names. The loop (train/loop.py) calls four methods
and nothing family-specific:

    prepare(draft, cfg, target, source)  once, before resuming and the first step; -> a log line or None
    plan(draft, batch, generators)       what a micro-batch trains on; data only, never the weights
    weight(plan)                         the plan's share of the loss normaliser: data-parallel ranks
                                         and micro-batches scale their losses by own / global weight
    loss(draft, batch, plan)             -> LossOut (train/losses.py)

dspark and dflash train random anchor blocks (train/step.py); eagle3 and mtp (the target's own
MTP head) train a training-time test over every position (train/ttt.py). A family accepts the loss kinds its rows fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from splitserve.config import RunConfig
from splitserve.errors import UserError
from splitserve.models import build  # noqa: F401  (registers the draft families)
from splitserve.models.families import get_family
from splitserve.train.losses import LossOut
from splitserve.train.step import Batch, draft_loss, plan_blocks, position_weight
from splitserve.train.ttt import TTTObjective
from splitserve.train.vocab import fit_vocab


class Objective(Protocol):
    def prepare(self, draft: torch.nn.Module, cfg: RunConfig, target: Any, source: Any) -> str | None: ...

    def plan(self, draft: torch.nn.Module, batch: Batch, generators: Sequence[torch.Generator]) -> Any: ...

    def weight(self, plan: Any) -> float: ...

    def loss(self, draft: torch.nn.Module, batch: Batch, plan: Any) -> LossOut: ...


class BlockObjective:
    """DSpark and DFlash: anchors sampled per sequence, their blocks packed (train/step.py)."""

    def __init__(self, cfg: RunConfig):
        self.anchors_per_seq, self.loss_cfg, self.chunk_rows = cfg.train.anchors_per_seq, cfg.loss, \
            cfg.train.loss_chunk_rows

    def prepare(self, draft, cfg, target, source) -> str | None:
        if not draft.arch.reduced:  # the whole vocabulary: nothing to fit
            return None
        return fit_vocab(draft, draft.arch.draft_vocab_size, cfg, target, source)

    def plan(self, draft, batch, generators):
        return plan_blocks(draft, batch, self.anchors_per_seq, generators)

    def weight(self, plan) -> float:
        return float(position_weight(plan, self.loss_cfg))

    def loss(self, draft, batch, plan) -> LossOut:
        out, _ = draft_loss(draft, batch, self.anchors_per_seq, self.loss_cfg, None, packed=plan,
                            chunk_rows=self.chunk_rows)
        return out


# family -> (objective, the loss kinds it trains with, what to say when another is asked for)
OBJECTIVES = {
    "dspark": (BlockObjective, ("paper", "prefix"), "loss.kind=ttt is EAGLE-3's and MTP's (draft=eagle3, draft=mtp)"),
    "dflash": (BlockObjective, ("paper", "prefix"), "loss.kind=ttt is EAGLE-3's and MTP's (draft=eagle3, draft=mtp)"),
    "eagle3": (TTTObjective, ("ttt",), "its loss is the training-time test's (draft=eagle3 sets it)"),
    "mtp": (TTTObjective, ("ttt",), "its loss is the training-time test's (draft=mtp sets it)"),
}


def objective_for(cfg: RunConfig) -> Objective:
    """The objective of cfg.draft.family, checked against cfg.loss before anything loads: an
    unknown family or a loss kind the family cannot train with is a one-line UserError."""
    family = get_family(cfg.draft.family)
    if family.name not in OBJECTIVES:
        raise UserError(f"draft.family={family.name} has no training objective (train/objectives.py)")
    make, kinds, hint = OBJECTIVES[family.name]
    if cfg.loss.kind not in kinds:
        raise UserError(f"draft.family={family.name} trains with loss.kind {' or '.join(kinds)}, not "
                        f"{cfg.loss.kind!r}: {hint}")
    if cfg.eval.enabled and not family.serves:  # refused now, not after training
        raise UserError(f"draft.family={family.name}: the held-out evaluation drafts with the speculative engine, "
                        "which does not draft with this family yet; set eval.enabled=false")
    return make(cfg)
