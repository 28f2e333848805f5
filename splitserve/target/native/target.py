"""NativeTarget: a transformers target whose static-cache forwards run on the native decoder.

Everything a draft reads (weights, config, tokenizer) and every dynamic-cache or whole-sequence
path (captures for training, `forward_cached` for the reference loop, `generate` for baselines)
is the wrapped HFTarget's own; only `new_static_cache` and `forward_static`, the serving
engine's two, are native. Both paths share one copy of the weights (target/native/weights.py).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from splitserve.records import Capture
from splitserve.target.arch import text_config
from splitserve.target.hf import HFTarget, decoder_layers
from splitserve.target.native.decoder import NativeDecoder, NativeKVCache
from splitserve.target.native.support import modules_reason, native_reason
from splitserve.target.native.weights import Layer, in_format, pack_layers


class NativeTarget:
    """Implements `CaptureTarget` and `DecodingTarget` (target/backend.py)."""

    def __init__(self, hf: HFTarget, weight_format: str = "model", products: str = "fused"):
        reason = target_reason(hf)
        if reason is not None:
            raise ValueError(f"{hf.info.name}: the native decoder does not serve this target: {reason}")
        self.hf = hf
        self.info, self.config, self.tokenizer = hf.info, hf.config, hf.tokenizer
        self.logit_transform, self.layout = hf.logit_transform, hf.layout
        self.weight_format = weight_format
        tc = text_config(hf.config)
        decoder = hf.decoder
        attn = decoder_layers(decoder, hf.info.num_layers, hf.info.name)[0].self_attn
        num_heads = int(tc.num_attention_heads)
        self.native = NativeDecoder(
            in_format(_packed(hf), weight_format),
            embed=decoder.embed_tokens.weight.detach(), final_norm=decoder.norm.weight.detach(),
            rotary=decoder.rotary_emb, num_heads=num_heads,
            num_kv_heads=int(getattr(tc, "num_key_value_heads", None) or num_heads),
            head_dim=int(getattr(tc, "head_dim", None) or tc.hidden_size // num_heads),
            eps=float(tc.rms_norm_eps), scale=float(attn.scaling), capture_ids=hf.info.layer_ids,
            products=products,
        )

    @property
    def decoder_label(self) -> str:
        """What a server's start line says of its target forward."""
        return "native" if self.weight_format == "model" else f"native, {self.weight_format} weights (not lossless)"

    # ---- TargetWeights and the transformers paths: the wrapped target's own -------------

    @property
    def device(self) -> torch.device:
        return self.hf.device

    @property
    def dtype(self) -> torch.dtype:
        return self.hf.dtype

    def embed_weight(self) -> torch.Tensor:
        return self.hf.embed_weight()

    def lm_head_weight(self) -> torch.Tensor:
        return self.hf.lm_head_weight()

    def capture(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Capture:
        return self.hf.capture(input_ids, attention_mask)

    @property
    def max_positions(self) -> int | None:
        return self.hf.max_positions

    def eos_ids(self) -> frozenset[int]:
        return self.hf.eos_ids()

    def new_cache(self) -> Any:
        return self.hf.new_cache()

    def forward_cached(self, input_ids: torch.Tensor, cache: Any, logits_from: int = 0) -> tuple[torch.Tensor, Capture]:
        return self.hf.forward_cached(input_ids, cache, logits_from)

    def crop_cache(self, cache: Any, length: int) -> None:
        self.hf.crop_cache(cache, length)

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, eos_ids: frozenset[int] = frozenset(),
                 streamer: Any = None, assistant: Any = None) -> torch.Tensor:
        return self.hf.generate(input_ids, max_new_tokens, eos_ids, streamer, assistant)

    # ---- the native static-cache forward ------------------------------------------------

    def new_static_cache(self, max_len: int) -> NativeKVCache:
        return self.native.new_cache(max_len)

    # torch.compile of the engine's steps (EngineConfig.compile_backend) stops at this call: the
    # native forward is already a few hand-fused kernels per layer, and tracing its 30+ layers
    # would cost minutes of compilation for nothing. The CUDA graph holds both sides of the break.
    @torch.compiler.disable
    @torch.no_grad()
    def forward_static(self, input_ids: torch.Tensor, cache: NativeKVCache, positions: torch.Tensor,
                       logits_from: int = 0, window: int | None = None,
                       verify: bool = False) -> tuple[torch.Tensor, Capture]:
        """input_ids (1, T) at positions (T,) -> logits (1, T - logits_from, V) float32, aux (1, T, m*D)."""
        window = cache.max_len if window is None else window
        if not 0 < window <= cache.max_len:
            raise ValueError(f"attention window {window} is outside 1..{cache.max_len}")
        hidden, aux = self.native.forward(input_ids[0], positions, cache, window)  # (T, D), (T, m*D)
        logits = self.hf._logits(hidden[None, logits_from:])  # (1, T - logits_from, V)
        return logits, Capture(aux=aux[None], final=None)

    @property
    def recurrent(self) -> bool:
        return False  # the native family is attention-only

    def commit_static(self, cache: NativeKVCache, keep: int) -> None:
        """Nothing to commit: the next forward's masks hide the rejected slots."""


def target_reason(hf: HFTarget) -> str | None:
    """Why the native decoder cannot serve this transformers target (None: it can)."""
    reason = native_reason(hf.config)
    if reason is None:
        reason = modules_reason(decoder_layers(hf.decoder, hf.info.num_layers, hf.info.name), hf.dtype)
    return reason


def _packed(hf: HFTarget) -> list[Layer]:
    """The target's packed layers in its own dtype: packed once, however many formats and engines
    are built on it (packing re-points the modules, so a second packing would be a second copy)."""
    if hf not in _PACKED:
        _PACKED[hf] = pack_layers(decoder_layers(hf.decoder, hf.info.num_layers, hf.info.name), hf.layout.windows)
        hf.weights_version += 1  # graphs captured over the old storage are stale (target/graphs.py)
    return _PACKED[hf]


def native_target(target: Any, decoder: str = "auto", weight_format: str = "model",
                  products: str = "fused") -> Any:
    """The target to serve with: NativeTarget when `decoder` is native, or auto and the target is
    a transformers target of the native family; otherwise the target itself. decoder="native" on
    a target outside the family is an error naming why."""
    if decoder not in ("auto", "native", "hf"):
        raise ValueError(f"decoder must be auto, native or hf, got {decoder!r}")
    if weight_format != "model" and decoder == "hf":
        raise ValueError(f"weight_format={weight_format!r} needs the native decoder (decoder=auto or native)")
    if decoder == "hf" or isinstance(target, NativeTarget):
        return target
    if not isinstance(target, HFTarget):
        if decoder == "native":
            raise ValueError(f"the native decoder wraps a transformers target, not {type(target).__name__}")
        return target
    if decoder == "auto" and weight_format == "model" and target_reason(target) is not None:
        return target  # auto falls back; asked for explicitly, NativeTarget refuses with the reason
    key = (weight_format, products)
    built = _BUILT.setdefault(target, {})
    if key not in built:  # one NativeTarget per target and settings, however many engines it serves
        built[key] = NativeTarget(target, weight_format, products)
    return built[key]


_PACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
