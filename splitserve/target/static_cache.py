"""A preallocated target KV cache for serving: fixed size, written in place, rewound by a number.

Why not transformers' StaticCache: its write position is a per-layer counter that advances on
every update and is cropped by a Python int, so rewinding after a rejection either syncs the
host or reaches into private attributes that change between releases. Here the caller says
where each new token goes (`bind(positions)`, a device tensor) and the attention mask says what
is visible, so "rewind" is just a smaller committed length in the next round's positions: the
stale entries beyond it are masked out and later overwritten. Every shape is fixed by
`max_len` (or by the bound window), which is what a CUDA graph needs.

Attention window: `bind(positions, window=W)` makes the next forward attend to slots 0..W-1
only, not the whole buffer. The caller picks W >= every position written, so nothing visible
is cut; a short chat in a long-context server then pays attention over its live prefix rather
than over `max_len` slots (one CUDA graph per window, speculative/engine.py). This window is the
engine's, not the model's: a sliding-window layer's own window is applied by its mask
(`visible_mask(..., sliding_window)`), over the same buffers.

Duck-typed to the transformers cache protocol (`update(k, v, layer_idx, ...)`), so any HF
decoder that calls `cache.update` inside its attention works unchanged. A hybrid target's
recurrent layers keep their conv windows and states in a `RecurrentStore` (target/recurrent.py),
reached through the same cache object by the calls transformers' mixers make
(`get_conv_state`, `update_recurrent_state`, ...).
Glossary: T new tokens, L capacity (max_len), Hkv key/value heads, hd head dim.
"""

from __future__ import annotations

from typing import Any

import torch

from splitserve.target.recurrent import RecurrentStore


class StaticKVCache:
    is_compileable = True  # read by some transformers code paths; the buffers never move

    def __init__(self, num_layers: int, max_len: int, recurrent: RecurrentStore | None = None):
        self.max_len = max_len
        self.keys: list[torch.Tensor | None] = [None] * num_layers  # each (1, Hkv, L, hd)
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self._positions: torch.Tensor | None = None
        self.window = max_len  # W: slots the next forward attends to
        self.recurrent = recurrent  # the recurrent layers' states (hybrid targets), else None

    def reset(self) -> None:
        """Start a new sequence: recurrent states back to zero. K/V slots need nothing (every
        slot at or above the new sequence's positions is masked until it is written)."""
        if self.recurrent is not None:
            self.recurrent.reset()

    def __getattr__(self, name: str) -> Any:
        # The recurrent layers' cache calls (get_conv_state, update_recurrent_state, ...) go to the store.
        store = self.__dict__.get("recurrent")
        if store is not None and name in RecurrentStore.CACHE_METHODS:
            return getattr(store, name)
        raise AttributeError(name)

    def bind(self, positions: torch.Tensor, window: int | None = None) -> None:
        """positions: (T,) long, where the next forward's T tokens are written, all < window."""
        window = self.max_len if window is None else window
        if not 0 < window <= self.max_len:
            raise ValueError(f"attention window {window} is outside 1..{self.max_len}")
        self._positions, self.window = positions, window

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        """key, value: (1, Hkv, T, hd) -> the buffers' first W slots (1, Hkv, W, hd); the mask
        hides positions that are not committed and not part of this forward."""
        if self.keys[layer_idx] is None:  # first (prefill) call sizes the buffers
            shape = (*key.shape[:2], self.max_len, key.shape[-1])
            self.keys[layer_idx] = key.new_zeros(shape)
            self.values[layer_idx] = value.new_zeros((*shape[:3], value.shape[-1]))
        k_buf, v_buf = self.keys[layer_idx], self.values[layer_idx]
        k_buf.index_copy_(2, self._positions, key.to(k_buf.dtype))
        v_buf.index_copy_(2, self._positions, value.to(v_buf.dtype))
        return k_buf[:, :, : self.window], v_buf[:, :, : self.window]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        # Positions are always passed explicitly; nothing should derive them from the cache.
        raise RuntimeError("StaticKVCache has no host-side length: pass position_ids explicitly")


def visible_mask(positions: torch.Tensor, max_len: int, sliding_window: int | None = None) -> torch.Tensor:
    """positions: (T,) absolute positions of the new tokens -> (1, 1, T, L) bool.

    Query i sees cache slot j iff j <= positions[i]: the committed prefix (< positions[0]) plus
    the new tokens up to itself. Stale slots from rejected drafts are all above and stay hidden.
    A sliding-window layer (window W) also hides slots j <= positions[i] - W, as transformers'
    own sliding masks do: the cache keeps every slot, the mask applies the window, so a rewind
    needs no slot the window has already passed.
    """
    slots = torch.arange(max_len, device=positions.device)
    visible = slots[None, :] <= positions[:, None]  # (T, L)
    if sliding_window is not None:
        visible &= slots[None, :] > positions[:, None] - sliding_window
    return visible[None, None]
