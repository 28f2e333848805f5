"""What crosses a process or storage boundary: one small, versioned record type with tensors.

A `HiddenRecord` is one training sample as the target saw it. The offline dump stores them;
the split trainer streams them. Nothing else that crosses a boundary carries tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SCHEMA_VERSION = 1


@dataclass
class HiddenRecord:
    """One sample's tokens and the target's hidden states at every position.

    input_ids: (T,) int64
    loss_mask: (T,) bool, True on tokens the draft is trained to predict (assistant turns)
    aux:       (T, m*D) captured layers' outputs, concatenated in layer-id order
    final:     (T, D) final-norm hidden state, the lm_head's input
    """

    sample_id: int
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    aux: torch.Tensor
    final: torch.Tensor

    def __post_init__(self) -> None:
        t = self.input_ids.shape[0]
        if self.loss_mask.shape != (t,) or self.aux.shape[0] != t or self.final.shape[0] != t:
            raise ValueError(
                f"record {self.sample_id}: inconsistent lengths ids={tuple(self.input_ids.shape)} "
                f"mask={tuple(self.loss_mask.shape)} aux={tuple(self.aux.shape)} "
                f"final={tuple(self.final.shape)}"
            )

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
