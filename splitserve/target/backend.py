"""The seam between a frozen target and everything that consumes its hidden states.

A backend runs the target and returns `Capture`s; training (online or offline) and the
speculative decoder only see this interface, so a later SGLang backend is a drop-in.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from splitserve.records import Capture, TargetInfo


class TargetBackend(Protocol):
    info: TargetInfo
    config: Any  # the target's HF config (a multimodal one nests its text config)

    def capture(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Capture:
        """Full-sequence capture for training. input_ids: (B, T). Never computes logits."""

    def embed_weight(self) -> torch.Tensor:
        """(V, D) token embedding, to copy into the draft."""

    def lm_head_weight(self) -> torch.Tensor:
        """(V, D) output projection, to copy into the draft."""

    def new_cache(self) -> Any:
        """An empty KV cache for `forward_cached`."""

    def forward_cached(
        self, input_ids: torch.Tensor, cache: Any, logits_from: int = 0
    ) -> tuple[torch.Tensor, Capture]:
        """Decode-time forward: extend `cache` with input_ids (1, T).

        Returns logits (1, T - logits_from, V) for the last positions only, and the capture
        (aux only) of all T new positions.
        """

    def crop_cache(self, cache: Any, length: int) -> None:
        """Drop cached positions >= length (rejected draft tokens)."""

    def new_static_cache(self, max_len: int) -> Any:
        """A preallocated cache of `max_len` positions for `forward_static` (serving)."""

    def forward_static(
        self, input_ids: torch.Tensor, cache: Any, positions: torch.Tensor, logits_from: int = 0,
        window: int | None = None,
    ) -> tuple[torch.Tensor, Capture]:
        """Static-shape forward: input_ids (1, T) written at `positions` (T,), a device tensor.

        Each token sees the cache below positions[0] and the new tokens up to itself, so a
        rejected draft is rewound by starting the next forward at a lower position. Attention
        reads only the first `window` slots (None: all); every position must be below it.
        Returns logits (1, T - logits_from, V) and the capture (aux only) of all T positions.
        """
