"""What crosses a package, process or storage boundary.

A `HiddenRecord` is one training sample as the target saw it: the dump stores them, the split
trainer streams them, and it is the one versioned type that carries tensors between processes.
`TargetInfo` (a target's identity, which a draft must match) and `Capture` (the hidden states a
target backend returns) are what every package that meets a target speaks.
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


@dataclass(frozen=True)
class TargetInfo:
    """Identity of a target: what a draft must match before any compute."""

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    layer_ids: tuple[int, ...]  # captured layers, HF indexing (hidden_states[l + 1])


@dataclass
class Capture:
    """Hidden states the draft needs for a span of tokens.

    aux:   (B, T, m*D) the m captured layers' outputs, concatenated on the last dim
    final: (B, T, D)   the final-norm hidden state (lm_head input), or None when not asked for
    """

    aux: torch.Tensor
    final: torch.Tensor | None
