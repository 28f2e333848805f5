"""Exact rewind of recurrent layers (linear attention, gated delta nets, KDA, Mamba-2) during
speculative decoding: the state after the accepted prefix becomes the state.

An attention layer keeps one K/V entry per position, so a rejected draft token is undone by
hiding its slot. A recurrent layer folds every token into one state (a conv window and a
recurrent matrix); the state before a rejected token cannot be read back from the state after
it. The mechanism here is *replay of the accepted prefix through the recurrent mixers only*:

    verify   the target runs on [x_p, d_1..d_γ]; each recurrent mixer reads the committed state
             and its input (1, γ+1, D) is kept. Static caches (serving): the mixers' state writes
             are discarded (`RecurrentStore` in trial mode). Dynamic caches (reference loop): the
             state before the forward is kept instead, and put back before a replay.
    commit   after the verdict (n accepted), each mixer runs again on its kept input's first
             n+1 rows from the committed state, writing the new committed state. Nothing else
             of the model runs: attention, MLPs and MoE layers are not touched.

Why this mechanism (docs/targets.md, "Recurrent layers" measures it): it is exact by
construction (the mixer's own forward, the same inputs, the same kernels, fla's when installed,
transformers' PyTorch reference otherwise), it works for every transformers mixer that keeps
its state through the cache's `update_conv_state` / `update_recurrent_state` calls (Qwen3-Next
and Qwen3.5 gated DeltaNet, Kimi-Linear and Ling KDA, Nemotron-H, Falcon-H1 and Granite-4.0-H
Mamba-2), and its cost is one read of the recurrent mixers' weights per round, not γ+1 copies
of every state. The host must know n before the commit, so a round on a recurrent target is not
queued ahead of the previous one's read (speculative/engine.py).
Glossary: T new tokens, D hidden size, K conv kernel width, C conv channels.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from splitserve.target.arch import UnsupportedTargetError

STATE_PARAM = "A_log"  # every transformers recurrent mixer (GDN, KDA, Mamba-2) owns its decay as A_log


def find_mixers(layers: nn.ModuleList, recurrent: tuple[bool, ...], name: str = "target") -> dict[int, nn.Module]:
    """layer index -> the child of that decoder layer that holds its recurrent state (the
    child whose parameters include an A_log), for every layer flagged recurrent."""
    mixers = {}
    for i, flagged in enumerate(recurrent):
        if not flagged:
            continue
        found = [child for _, child in layers[i].named_children()
                 if any(p.split(".")[-1] == STATE_PARAM for p, _ in child.named_parameters())]
        if len(found) != 1:
            raise UnsupportedTargetError(
                f"{name}: layer {i} is recurrent but {len(found)} of its modules hold a recurrent state "
                f"(an {STATE_PARAM} parameter); splitserve rewinds layers with exactly one"
            )
        mixers[i] = found[0]
    return mixers


class MixerReplay:
    """Keeps each recurrent mixer's input during a recorded forward and replays a prefix of it.

    `recording` is a host flag set around a forward; while it is on, a forward pre-hook copies
    the mixer's hidden states (1, T, D) into a persistent buffer (a CUDA graph of the forward
    captures that copy, so the buffer is refreshed on every replay)."""

    def __init__(self, mixers: dict[int, nn.Module]):
        self.mixers = mixers
        # the keyword each mixer takes its cache by, read once (not on every replay)
        self._cache_kw = {i: "cache_params" if "cache_params" in _params(mod) else "cache" for i, mod in mixers.items()}
        self.recording = False
        self.inputs: dict[int, torch.Tensor] = {}  # layer -> (1, T, D), the last recorded forward's
        self._kwargs: dict[int, dict[str, Any]] = {}
        for i, mod in mixers.items():
            mod.register_forward_pre_hook(self._hook(i), with_kwargs=True)

    def _hook(self, layer: int):
        def keep(_module, args, kwargs):
            if not self.recording:
                return None
            hidden = args[0] if args else kwargs["hidden_states"]  # (1, T, D)
            buf = self.inputs.get(layer)
            if buf is None or buf.shape != hidden.shape or buf.dtype != hidden.dtype:
                buf = self.inputs[layer] = torch.empty_like(hidden)
            buf.copy_(hidden)
            # everything but the states, the cache and the (padding-free) mask is a per-layer setting
            self._kwargs[layer] = {k: v for k, v in kwargs.items()
                                   if k not in ("hidden_states", "cache", "cache_params", "past_key_values",
                                                "attention_mask") and not torch.is_tensor(v)}
            return None

        return keep

    def replay(self, cache: Any, keep: int) -> None:
        """Run every mixer on the first `keep` rows of its recorded input, from the state the
        cache holds now, so the cache ends holding the state after those rows."""
        if not self.inputs:
            raise RuntimeError("no recorded forward to replay")
        for i, mod in self.mixers.items():
            hidden = self.inputs[i][:, :keep]  # (1, keep, D)
            mod(hidden_states=hidden, attention_mask=None, **{self._cache_kw[i]: cache}, **self._kwargs.get(i, {}))


def _params(mod: nn.Module) -> tuple[str, ...]:
    import inspect

    return tuple(inspect.signature(mod.forward).parameters)


class RecurrentStore:
    """The conv windows and recurrent states of a static cache's recurrent layers, with the
    cache methods transformers' mixers call (`get_conv_state`, `update_conv_state`,
    `get_recurrent_state`, `update_recurrent_state`, `has_previous_state`, `is_recording_past`).

    Buffers are allocated by their first update (shapes come from the mixer) and never move, so
    CUDA graphs can hold them. A fresh request starts from zeros (`reset`), which is what a
    mixer computes from no state (the causal conv pads with zeros, the recurrence starts at 0).
    In `trial` mode (a verify forward) the states are read, never written: the mixer gets the
    committed conv window ahead of its new columns, and its new state is dropped."""

    CACHE_METHODS = ("get_conv_state", "update_conv_state", "get_recurrent_state", "update_recurrent_state",
                     "has_previous_state", "is_recording_past")

    def __init__(self):
        self.conv: dict[tuple[int, int], torch.Tensor] = {}  # (layer, state idx) -> (1, C, K)
        self.state: dict[tuple[int, int], torch.Tensor] = {}  # (layer, state idx) -> mixer-shaped state
        self.trial = False

    def reset(self) -> None:
        for t in (*self.conv.values(), *self.state.values()):
            t.zero_()

    def has_previous_state(self, layer_idx: int | None = None, state_idx: int | None = None) -> bool:
        return bool(self.conv or self.state)

    def is_recording_past(self, layer_idx: int) -> bool:
        # True keeps a one-token trial forward off the mixers' in-place conv update
        return self.trial

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return self.conv.get((layer_idx, state_idx))

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return self.state.get((layer_idx, state_idx))

    def update_conv_state(self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0,
                          conv_kernel_size: int | None = None, **_: Any) -> torch.Tensor:
        """conv_states (1, C, T) new columns -> (1, C, K + T), the committed window ahead of them."""
        key = (layer_idx, state_idx)
        if key not in self.conv:
            k = conv_kernel_size or conv_states.shape[-1]
            self.conv[key] = conv_states.new_zeros((*conv_states.shape[:-1], k))
        window = self.conv[key]
        full = torch.cat([window, conv_states.to(window.dtype)], dim=-1)
        if not self.trial:
            window.copy_(full[..., -window.shape[-1]:])
        return full

    def update_recurrent_state(self, recurrent_states: torch.Tensor, layer_idx: int, state_idx: int = 0,
                               **_: Any) -> torch.Tensor:
        key = (layer_idx, state_idx)
        if key not in self.state:
            self.state[key] = torch.zeros_like(recurrent_states)
        if not self.trial:
            self.state[key].copy_(recurrent_states)
        return recurrent_states


def snapshot(cache: Any) -> list[tuple[Any, dict, dict]]:
    """A transformers cache's recurrent layers' states, cloned (the dynamic-cache path keeps
    the state before a verify forward this way)."""
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    out = []
    for layer in getattr(cache, "layers", []):
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            out.append((layer, {i: None if t is None else t.clone() for i, t in layer.conv_states.items()},
                        {i: None if t is None else t.clone() for i, t in layer.recurrent_states.items()}))
    return out


def restore(saved: list[tuple[Any, dict, dict]]) -> None:
    for layer, conv, rec in saved:
        for i, t in conv.items():
            if t is not None:
                layer.conv_states[i] = t.clone()
        for i, t in rec.items():
            if t is not None:
                layer.recurrent_states[i].copy_(t)
