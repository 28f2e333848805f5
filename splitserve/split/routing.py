"""Which rank does what in a split job, and which sample goes where.

Routing keeps split training equal to single-process training on the same seed:

* Step s's global batch is `DataOrder.batch(s)` (B samples). Draft rank j trains on the
  contiguous slice `[j*b, (j+1)*b)` with b = B / n_draft, so the concatenation over draft ranks
  is the single-process batch.
* Draft rank j's stream S_j is its slices of steps start, start+1, ... in order. Item k of S_j
  (counted from step 0) is produced by target rank k mod n_target. A strict round-robin fan-in
  over the target ranks, starting at the right one, then returns exactly S_j.
* Every target rank walks one global order (step, then draft rank, then slice position) and
  produces only its own items. Both ends follow that order, so with any credit count the
  earliest unreceived item can always be sent and received: the pipeline cannot deadlock.

Nothing here depends on state beyond (seed, step), so resuming needs only the start step.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from splitserve.config import SplitConfig
from splitserve.stream.sources import DataOrder


class SplitConfigError(ValueError):
    """The split does not fit the torchrun world or the batch."""


@dataclass(frozen=True)
class Roles:
    """The split resolved against one world."""

    world_size: int
    target_ranks: tuple[int, ...]
    draft_ranks: tuple[int, ...]

    @classmethod
    def resolve(cls, cfg: SplitConfig, world_size: int) -> Roles:
        if cfg.target_ranks is not None:
            targets = tuple(sorted(set(cfg.target_ranks)))
            if len(targets) != len(cfg.target_ranks):
                raise SplitConfigError(f"split.target_ranks has duplicates: {cfg.target_ranks}")
        else:
            targets = tuple(range(cfg.num_target_ranks))
        bad = [r for r in targets if not 0 <= r < world_size]
        if bad:
            raise SplitConfigError(f"split.target_ranks {list(bad)} are outside the world of {world_size} ranks")
        drafts = tuple(r for r in range(world_size) if r not in targets)
        if not targets or not drafts:
            raise SplitConfigError(
                f"a split job needs at least one target rank and one draft rank; world {world_size}, "
                f"target ranks {list(targets)} (set split.num_target_ranks or split.target_ranks)"
            )
        return cls(world_size, targets, drafts)

    def role_of(self, rank: int) -> str:
        return "target" if rank in self.target_ranks else "draft"

    def names(self) -> dict[int, str]:
        """rank -> "target 0" / "draft 1" (index within the role), for messages."""
        out = {r: f"target {i}" for i, r in enumerate(self.target_ranks)}
        out.update({r: f"draft {i}" for i, r in enumerate(self.draft_ranks)})
        return out

    def describe(self) -> str:
        return f"{len(self.target_ranks)} target + {len(self.draft_ranks)} draft ranks"


@dataclass(frozen=True)
class Routing:
    """Sample routing for one (data order, roles) pair."""

    order: DataOrder
    n_target: int
    n_draft: int

    def __post_init__(self) -> None:
        if self.order.bs % self.n_draft:
            raise SplitConfigError(
                f"train.batch_size={self.order.bs} must be a multiple of the {self.n_draft} draft ranks"
            )

    @property
    def per_rank(self) -> int:
        """Samples per draft rank per step."""
        return self.order.bs // self.n_draft

    def consumer_batch(self, step: int, draft_index: int) -> list[int]:
        """Sample indices draft rank `draft_index` trains on at `step`."""
        b = self.per_rank
        return self.order.batch(step)[draft_index * b : (draft_index + 1) * b]

    def producer_of(self, step: int, slot: int) -> int:
        """Index of the target rank that produces item `slot` of a draft rank's slice at `step`."""
        return (step * self.per_rank + slot) % self.n_target

    def first_producer(self, step: int) -> int:
        """The target rank whose record a draft rank receives first when starting at `step`."""
        return self.producer_of(step, 0)

    def producer_items(self, target_index: int, start: int, stop: int) -> Iterator[tuple[int, int, int]]:
        """(step, draft_index, sample) for every item target rank `target_index` produces, in
        the global order: step, then draft rank, then slice position."""
        for step in range(start, stop):
            batch = self.order.batch(step)
            for j in range(self.n_draft):
                for slot in range(self.per_rank):
                    if self.producer_of(step, slot) == target_index:
                        yield step, j, batch[j * self.per_rank + slot]
