"""Draft families: the one seam through which a kind of draft enters splitserve.

A family is chosen in config (`draft.family`) and names what the rest of the code needs of it:

    arch      a frozen dataclass with to_dict / from_dict: the resolved shapes and the target's
              identity (vocab_size, hidden_size, target_layer_ids, target_name, target_num_layers),
              written to a run's draft_arch.json next to the family's name
    model     the nn.Module built from an arch: load_shared(embed, lm_head) copies the target's
              frozen weights in, trainable_state_dict() is what a checkpoint holds
    resolve   (DraftConfig, TargetInfo, the target's HF config, tokenizer) -> arch
    describe  arch -> one line for the training log
    serves    whether the speculative round drafts with it (eval, serve, bench): its drafter in
              speculative/drafter.py

Families register in models/build.py, next to their resolvers. How a training batch becomes the
family's loss is the training side of the same seam (train/objectives.py, keyed by family name),
so one loop, one checkpoint format and one loader serve every family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from splitserve.errors import UserError


class ArchRecord:
    """to_dict / from_dict of a family's frozen arch dataclass (draft_arch.json): JSON holds the
    captured layer ids as a list where the arch keeps a tuple. Arches inherit it."""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["target_layer_ids"] = list(d["target_layer_ids"])
        return d

    @classmethod
    def from_dict(cls, d: dict):
        d = dict(d)
        d["target_layer_ids"] = tuple(d["target_layer_ids"])
        return cls(**d)


@dataclass(frozen=True)
class DraftFamily:
    name: str
    arch: type
    model: type
    resolve: Callable[..., Any]
    describe: Callable[[Any], str]
    serves: bool = True


FAMILIES: dict[str, DraftFamily] = {}


def register(family: DraftFamily) -> DraftFamily:
    if family.name in FAMILIES:
        raise ValueError(f"draft family {family.name!r} is registered twice")
    FAMILIES[family.name] = family
    return family


def get_family(name: str) -> DraftFamily:
    """The family of that name; an unknown one is a one-line UserError naming the choices."""
    if name not in FAMILIES:
        raise UserError(f"draft.family={name!r}: must be one of {', '.join(sorted(FAMILIES))}")
    return FAMILIES[name]


def model_class(arch: Any) -> type:
    """The module class that an arch builds (families sharing an arch share their model)."""
    for family in FAMILIES.values():
        if isinstance(arch, family.arch):
            return family.model
    raise TypeError(f"{type(arch).__name__} is the arch of no registered draft family")
