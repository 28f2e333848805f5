"""This process's share of draft training: which slice of each global batch it trains on, and
the few reductions that make data-parallel training equal single-process training.

The model and the losses never see this; the training loop does. A single process is
`Partition()` (index 0 of 1) and every operation is then a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Partition:
    index: int = 0  # this rank's position among the draft ranks
    size: int = 1  # number of draft ranks
    group: dist.ProcessGroup | None = None  # the draft ranks only (never the target ranks)
    device: torch.device = torch.device("cpu")  # where reduction tensors live (CUDA for NCCL)
    own_group: dist.ProcessGroup | None = None  # a group of this rank alone (DeepSpeed's "mpu")

    @property
    def writer(self) -> bool:
        """The one rank that writes shared files (checkpoints, metrics, evaluation)."""
        return self.index == 0

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier(group=self.group)

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over the draft ranks (fp64, one message)."""
        if self.size == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        return t.tolist()

    def any(self, flag: bool) -> bool:
        """True on every draft rank if it is True on one (e.g. the time budget ran out)."""
        return self.sum([float(flag)])[0] > 0
