"""The seams between a frozen target and everything that consumes it.

Two interfaces, each small enough that a backend implements all of it:

    CaptureTarget    training, dumps, split target ranks: hidden states of whole sequences
    DecodingTarget   the reference loop, evaluation, the serving engine, bench: prefill and
                     verify forwards with a KV cache (dynamic, or static for serving)

Both extend `TargetWeights`, what building or loading a draft reads of its target (the shared
embedding and lm_head, the config, the tokenizer). Backends: `HFTarget` (target/hf.py) is both;
`SGLangTarget` (target/sglang_backend.py) captures only; `SharedWeightsTarget`
(target/shared_weights.py, a split job's draft ranks and export) is `TargetWeights` alone.
A caller that decodes checks its target with `require_decoding`, so a capture-only backend is
refused with one line instead of failing on a missing method.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from splitserve.errors import UserError
from splitserve.records import Capture, TargetInfo


class TargetWeights(Protocol):
    """What a draft reads of its target: identity, config, tokenizer and the two shared tensors."""

    info: TargetInfo
    config: Any  # the target's HF config (a multimodal one nests its text config)
    tokenizer: Any  # the target's tokenizer; None for bare-id targets (tests)
    logit_transform: Any  # target/arch.py LogitTransform: the target's logits from lm_head(h)

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    def embed_weight(self) -> torch.Tensor:
        """(V, D) token embedding, to copy into the draft."""

    def lm_head_weight(self) -> torch.Tensor:
        """(V, D) output projection, to copy into the draft."""


class CaptureTarget(TargetWeights, Protocol):
    """What training and dumps need: the captured hidden states of whole sequences."""

    def capture(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Capture:
        """Full-sequence capture for training. input_ids: (B, T). Never computes logits."""


class DecodingTarget(TargetWeights, Protocol):
    """What speculative decoding needs: forwards that extend and rewind a KV cache."""

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the target's positions cover (None: no limit in its config)."""

    def eos_ids(self) -> frozenset[int]:
        """The tokens that end a reply (target/eos.py); empty without a tokenizer."""

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
        window: int | None = None, verify: bool = False,
    ) -> tuple[torch.Tensor, Capture]:
        """Static-shape forward: input_ids (1, T) written at `positions` (T,), a device tensor.

        Each token sees the cache below positions[0] and the new tokens up to itself, so a
        rejected draft is rewound by starting the next forward at a lower position. Attention
        reads only the first `window` slots (None: all); every position must be below it.
        `verify`: the tokens are a trial; recurrent layers read their state without advancing
        it, and `commit_static` commits the accepted prefix (attention-only targets: no effect).
        Returns logits (1, T - logits_from, V) and the capture (aux only) of all T positions.
        """

    @property
    def recurrent(self) -> bool:
        """Some layer keeps a recurrent state: a verify forward needs `commit_static` after it."""

    def commit_static(self, cache: Any, keep: int) -> None:
        """After a `verify` forward, make its first `keep` tokens the recurrent layers' state
        (target/recurrent.py); the cache's `reset()` starts a new sequence. No-op without
        recurrent layers."""

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, eos_ids: frozenset[int] = frozenset(),
                 streamer: Any = None, assistant: Any = None) -> torch.Tensor:
        """The target's own greedy generation (a baseline): input_ids (1, T) -> (1, T + n).
        Without eos_ids EOS is ignored (n = max_new_tokens); `assistant`, a small causal LM
        with the target's tokenizer, makes it the backend's assisted generation."""


def members(protocol: type) -> set[str]:
    """The names a class must define to implement `protocol` (its own and its bases')."""
    names: set[str] = set()
    for base in protocol.__mro__:
        if base in (Protocol, object) or not getattr(base, "_is_protocol", False):
            continue
        names |= {n for n in vars(base) if not n.startswith("_")}
        names |= set(getattr(base, "__annotations__", {}))
    return names


DECODING_MEMBERS = frozenset(members(DecodingTarget) - members(TargetWeights))


def decodes(target: Any) -> bool:
    """Does `target` implement DecodingTarget (beyond the TargetWeights every backend has)?"""
    return all(hasattr(type(target), name) for name in DECODING_MEMBERS)  # methods and properties


def require_decoding(target: Any, what: str) -> DecodingTarget:
    """`target`, or a one-line UserError when its backend only captures (`what` needs decoding)."""
    if not decodes(target):
        raise UserError(
            f"{what} decodes with a KV cache, and the {type(target).__name__} target only captures hidden "
            "states (train, dump): load the target with target.backend=transformers"
        )
    return target
