"""Transformers target backend: a frozen HF causal LM with forward hooks on the captured layers.

Hooks (rather than `output_hidden_states=True`) keep only the m layers we need, so an 8K-token
sequence costs m+1 (T, D) tensors, not N+1. Logits are computed only where asked for.

The model is reached through transformers' own accessors (`get_decoder`, `get_input_embeddings`,
`get_output_embeddings`, `get_text_config`), so multimodal wrappers (Gemma-3 4B+) and other
layouts work; what the config says about windows, logit transforms and recurrent layers is read
by target/arch.py, before any weight is loaded.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch
from torch import nn

from splitserve.assets import resolve_target_path
from splitserve.config import TargetConfig
from splitserve.records import Capture, TargetInfo
from splitserve.target import eos
from splitserve.target.arch import ATTENTION_KINDS, LogitTransform, UnsupportedTargetError, attention_layout, text_config
from splitserve.target.layers import capture_layer_ids, check_layer_ids
from splitserve.target.recurrent import MixerReplay, RecurrentStore, find_mixers, restore, snapshot
from splitserve.target.static_cache import StaticKVCache, visible_mask

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def decoder_layers(decoder: nn.Module, num_layers: int, name: str = "target") -> nn.ModuleList:
    """The decoder's list of its `num_layers` blocks: `layers` (Llama, Qwen, Gemma, NeoX), `h`
    (GPT-2, Falcon, Bloom), or else its one ModuleList of that length."""
    for attr in ("layers", "h", "blocks"):
        mods = getattr(decoder, attr, None)
        if isinstance(mods, nn.ModuleList) and len(mods) == num_layers:
            return mods
    found = [m for m in decoder.children() if isinstance(m, nn.ModuleList) and len(m) == num_layers]
    if len(found) != 1:
        raise UnsupportedTargetError(f"{name}: cannot find the {num_layers} decoder layers in "
                                     f"{type(decoder).__name__} (found {len(found)} lists of that length)")
    return found[0]


class HFTarget:
    """Implements `CaptureTarget` and `DecodingTarget` (target/backend.py) over any transformers
    causal LM (Llama, Qwen, Gemma, ...)."""

    def __init__(self, model: nn.Module, info: TargetInfo, tokenizer: Any = None):
        self.model = model.eval().requires_grad_(False)
        self.config = model.config  # the whole HF config; its text part is text_config(config)
        self.info = info
        self.tokenizer = tokenizer
        self.layout = attention_layout(model.config, where=info.name)
        self.logit_transform = LogitTransform.from_config(model.config)
        self.decoder = model.get_decoder()
        # transformers renamed `past_key_values` to `cache` (5.x); accept either version.
        params = inspect.signature(self.decoder.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._captured: dict[int, torch.Tensor] = {}
        # Bumped whenever the modules' weights move to new storage (the native decoder's packing,
        # target/native/target.py): a CUDA graph captured before then reads freed memory.
        self.weights_version = 0
        layers = decoder_layers(self.decoder, info.num_layers, info.name)
        for layer_id in info.layer_ids:
            layers[layer_id].register_forward_hook(self._hook(layer_id))
        # Hybrid targets: the recurrent layers' mixers, whose inputs a verify forward keeps for
        # the replay that commits the accepted prefix (target/recurrent.py).
        self.replay = MixerReplay(find_mixers(layers, self.layout.recurrent, info.name)) if self.layout.hybrid else None

    def _hook(self, layer_id: int):
        def save(_module, _inputs, output):
            self._captured[layer_id] = output[0] if isinstance(output, tuple) else output

        return save

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def _take_aux(self) -> torch.Tensor:
        # (B, T, m*D): captured layers concatenated in layer-id order.
        aux = torch.cat([self._captured[i] for i in self.info.layer_ids], dim=-1)
        self._captured.clear()
        return aux

    @torch.no_grad()
    def capture(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Capture:
        """input_ids: (B, T) -> aux (B, T, m*D), final (B, T, D). No logits."""
        out = self.decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return Capture(aux=self._take_aux(), final=out.last_hidden_state)

    def embed_weight(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight

    def lm_head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    def mtp_state(self, arch) -> dict[str, torch.Tensor]:
        """The target's own MTP weights in the MTP draft's names (target/mtp_weights.py)."""
        # here, not at the top: mtp_weights reads the checkpoint through shared_weights, which imports this module
        from splitserve.target.mtp_weights import read_mtp_state

        return read_mtp_state(self, arch)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (1, T, D) final-norm states -> (1, T, V) float32 logits, transformed as the
        target's own forward does (soft-capping, scaling)."""
        return self.logit_transform(self.model.get_output_embeddings()(hidden).float())

    def new_cache(self) -> Any:
        """A cache that keeps every position of every layer. Built from the config, transformers
        gives sliding-window layers a cache that drops keys past the window, which cannot be
        cropped back; kept whole, those layers get their window from the model's own sliding
        mask instead, and a crop is exact."""
        from transformers import DynamicCache

        if not self.layout.hybrid:
            return DynamicCache()
        # A hybrid model needs its recurrent layers' cache layers, which the config gives; its
        # attention layers keep every position, so a crop is exact (as above).
        from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

        cache = DynamicCache(config=self.config)
        cache.layers = [DynamicLayer() if type(layer) is DynamicSlidingWindowLayer else layer for layer in cache.layers]
        return cache

    @torch.no_grad()
    def forward_cached(
        self, input_ids: torch.Tensor, cache: Any, logits_from: int = 0
    ) -> tuple[torch.Tensor, Capture]:
        """input_ids: (1, T) appended to cache -> logits (1, T - logits_from, V), aux (1, T, m*D).
        A hybrid target keeps the recurrent states from before the forward and each mixer's
        input, so `crop_cache` can replay the kept prefix."""
        if self.replay is not None:  # the length is kept here: a pure SSM's cache has no attention layer to ask
            cache.splitserve_undo = (snapshot(cache), input_ids.shape[1])
            cache.splitserve_len = getattr(cache, "splitserve_len", 0) + input_ids.shape[1]
            self.replay.recording = True
        try:
            out = self.decoder(input_ids=input_ids, use_cache=True, **{self._cache_kw: cache})
        finally:
            if self.replay is not None:
                self.replay.recording = False
        return self._logits(out.last_hidden_state[:, logits_from:]), Capture(aux=self._take_aux(), final=None)

    def crop_cache(self, cache: Any, length: int) -> None:
        """Drop positions >= length. Attention layers drop their K/V entries; recurrent layers go
        back to their state before the last forward and replay the part of it that is kept."""
        if self.replay is None:
            excess = cache.get_seq_length() - length
            if excess > 0:
                cache.crop(-excess)
            return
        from transformers.cache_utils import DynamicLayer

        excess = cache.splitserve_len - length
        if excess <= 0:
            return
        cache.splitserve_len = length
        saved, last_len = cache.splitserve_undo
        if excess > last_len:
            raise ValueError(f"a hybrid target's cache rewinds within its last forward ({last_len} tokens), "
                             f"not {excess}")
        for layer in cache.layers:
            if isinstance(layer, DynamicLayer):
                DynamicLayer.crop(layer, -excess)
        restore(saved)
        if last_len - excess > 0:
            self.replay.replay(cache, last_len - excess)

    @property
    def max_positions(self) -> int | None:
        return getattr(text_config(self.config), "max_position_embeddings", None)

    def eos_ids(self) -> frozenset[int]:
        return eos.eos_ids(self)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, eos_ids: frozenset[int] = frozenset(),
                 streamer: Any = None, assistant: Any = None) -> torch.Tensor:
        """transformers `generate`, greedy: input_ids (1, T) -> (1, T + n); `assistant` (a causal
        LM with the target's tokenizer) makes it transformers' assisted generation."""
        gen_cfg = copy.deepcopy(self.model.generation_config)
        gen_cfg.update(do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=None,
                       eos_token_id=sorted(eos_ids) or None, temperature=None, top_p=None, top_k=None)
        if gen_cfg.pad_token_id is None:
            gen_cfg.pad_token_id = 0
        extra = {"assistant_model": assistant} if assistant is not None else {}
        return self.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), generation_config=gen_cfg,
                                   streamer=streamer, **extra)

    # ---- static-shape decoding (serving) --------------------------------------------------

    def new_static_cache(self, max_len: int) -> StaticKVCache:
        impl = getattr(text_config(self.model.config), "_attn_implementation", "sdpa")
        if impl not in ("sdpa", "eager"):
            raise ValueError(f"static decoding needs attn_implementation 'sdpa' or 'eager' (a 4D mask), got {impl!r}")
        return StaticKVCache(self.info.num_layers, max_len, RecurrentStore() if self.layout.hybrid else None)

    @torch.no_grad()
    def forward_static(
        self, input_ids: torch.Tensor, cache: StaticKVCache, positions: torch.Tensor, logits_from: int = 0,
        window: int | None = None, verify: bool = False,
    ) -> tuple[torch.Tensor, Capture]:
        """input_ids: (1, T) written at `positions` (T,) of a static cache -> logits
        (1, T - logits_from, V) float32, aux (1, T, m*D). No host sync: positions and the mask
        are device tensors, every shape depends only on T and the window W (default: the whole
        cache; every position must be below it). `verify`: recurrent layers read their state
        and keep it; `commit_static` then commits the accepted prefix."""
        cache.bind(positions, window)
        trial = verify and self.replay is not None
        if trial:
            cache.recurrent.trial = self.replay.recording = True
        try:
            out = self.decoder(input_ids=input_ids, position_ids=positions[None],
                               attention_mask=self._static_masks(positions, cache.window), use_cache=True,
                               **{self._cache_kw: cache})
        finally:
            if trial:
                cache.recurrent.trial = self.replay.recording = False
        return self._logits(out.last_hidden_state[:, logits_from:]), Capture(aux=self._take_aux(), final=None)

    @property
    def recurrent(self) -> bool:
        return self.replay is not None

    @torch.no_grad()
    def commit_static(self, cache: StaticKVCache, keep: int) -> None:
        """After a `verify` forward: its first `keep` tokens become the recurrent layers' state
        (a replay through their mixers; fixed shapes for a given keep). Attention-only targets:
        nothing to do, the masks of the next forward hide the rejected slots."""
        if self.replay is not None:
            self.replay.replay(cache, keep)

    def _static_masks(self, positions: torch.Tensor, width: int) -> torch.Tensor | dict[str, torch.Tensor]:
        """The 4-D mask(s) over the first `width` cache slots: one (1, 1, T, W) mask when every
        layer has the same sliding window (or none), else one per layer type, the dict form the
        model's forward takes as it is (Gemma-2/3: sliding layers interleaved with full ones)."""

        def one(sliding_window: int | None) -> torch.Tensor:
            mask = visible_mask(positions, width, sliding_window)  # (1, 1, T, W) bool
            if text_config(self.model.config)._attn_implementation == "eager":  # eager adds it to the scores
                return torch.zeros(mask.shape, dtype=self.dtype, device=mask.device).masked_fill(
                    ~mask, torch.finfo(self.dtype).min
                )
            return mask

        windows = set(self.layout.windows)
        if self.layout.attention_free:  # a pure SSM: its forward takes no mask dict
            return None
        if self.layout.hybrid:  # recurrent layers take no mask (no padding): the model's dict form
            masks: dict[str, torch.Tensor | None] = {"full_attention": one(None), "linear_attention": None}
            masks.update({kind: one(w) for kind, w in self.layout.mask_keys().items() if kind in ATTENTION_KINDS})
            return masks
        if len(windows) == 1:
            return one(windows.pop())
        return {kind: one(w) for kind, w in self.layout.mask_keys().items()}


def hub_kwargs(cfg: TargetConfig) -> dict:
    """target.revision and target.trust_remote_code, for every from_pretrained of the target."""
    kw: dict = {"trust_remote_code": bool(cfg.trust_remote_code)}
    if cfg.revision is not None:
        kw["revision"] = cfg.revision
    return kw


def load_target_config(cfg: TargetConfig) -> Any:
    """The target's HF config (no weights), checked for what cannot be served exactly:
    UnsupportedTargetError names the architecture and why."""
    from transformers import AutoConfig

    from splitserve.errors import UserError, one_line

    path = resolve_target_path(cfg.path)
    try:
        config = AutoConfig.from_pretrained(path, **hub_kwargs(cfg))
    except (OSError, ValueError, KeyError) as exc:  # no config.json, bad JSON, an unknown model_type
        raise UserError(f"target {cfg.path}: its config cannot be read: {one_line(exc)}") from None
    attention_layout(config, where=f"target {cfg.path}")
    return config


def load_tokenizer(path: str, **hub_kw):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, **hub_kw)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(path: str, dtype: torch.dtype, device: torch.device, config: Any = None, **hub_kw) -> nn.Module:
    """A transformers causal LM, in eval mode, on `device`. On a GPU the weights go straight to
    it through a device map (accelerate): an 8B target never needs a full copy in host memory."""
    from transformers import AutoModelForCausalLM

    device_map = {"": device} if device.type == "cuda" else None
    if config is not None:
        hub_kw["config"] = config
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=device_map, **hub_kw)
    return model.to(device).eval()


def check_own_logits(target: HFTarget, num_tokens: int = 8) -> None:
    """Refuse a target whose own forward computes its logits otherwise than lm_head(decoder
    output) through the config's LogitTransform (a scaling or cap this code does not know), so
    T>0 verification never silently samples from another distribution. One short forward."""
    ids = torch.arange(num_tokens, device=target.device)[None] % target.info.vocab_size  # (1, n)
    with torch.no_grad():
        try:
            own = target.model(input_ids=ids, use_cache=False).logits[0].float()  # (n, V)
        except Exception:  # a wrapper whose forward wants more than token ids: nothing to compare
            return
        ours = target._logits(target.decoder(input_ids=ids, use_cache=False).last_hidden_state)[0]
    rtol = 1e-4 if target.dtype == torch.float32 else 2e-2
    err = float((ours - own).abs().max())
    scale = float(own.abs().max()) or 1.0
    target._captured.clear()
    if err > rtol * scale:
        raise UnsupportedTargetError(
            f"{target.info.name}: {type(target.model).__name__} computes its logits in a way splitserve does not "
            f"reproduce (max difference {err:.3g} at logit scale {scale:.3g}; from its config: "
            f"{target.logit_transform})"
        )


def load_hf_target(cfg: TargetConfig, device: torch.device | None = None) -> HFTarget:
    """Load a target per config: the embedded SmolLM2 or any local HF model directory. The
    config is checked before any weight is read."""
    path = resolve_target_path(cfg.path)
    if cfg.dtype not in DTYPES:
        raise ValueError(f"target.dtype must be one of {sorted(DTYPES)}, got {cfg.dtype!r}")
    config = load_target_config(cfg)
    model = load_causal_lm(path, DTYPES[cfg.dtype], device or pick_device(cfg.device), config, **hub_kwargs(cfg))
    tokenizer = load_tokenizer(path, **hub_kwargs(cfg))
    target = wrap_hf_model(model, cfg, tokenizer)
    check_own_logits(target)
    return target


def _info_from_config(mc, cfg: TargetConfig, name: str, validate: bool = True) -> TargetInfo:
    text_cfg = text_config(mc)
    n_layers = int(text_cfg.num_hidden_layers)
    layer_ids = capture_layer_ids(cfg, n_layers)
    if validate:
        check_layer_ids(layer_ids, n_layers, allow_last=cfg.layer_rule == "last")
    return TargetInfo(
        name=name,
        vocab_size=int(text_cfg.vocab_size),
        hidden_size=int(text_cfg.hidden_size),
        num_layers=n_layers,
        layer_ids=tuple(layer_ids),
    )


def peek_target_info(cfg: TargetConfig) -> TargetInfo:
    """The target's identity from its config.json alone: no weights are read. Layer ids are
    not validated here, so a caller can report a foreign draft's ids as a mismatch."""
    return _info_from_config(load_target_config(cfg), cfg, cfg.name, validate=False)


def wrap_hf_model(model: nn.Module, cfg: TargetConfig, tokenizer: Any = None, name: str | None = None) -> HFTarget:
    """Wrap an already-built HF model (tests use tiny random ones)."""
    info = _info_from_config(model.config, cfg, name or cfg.name)
    return HFTarget(model, info, tokenizer)
