"""The two target tensors a draft shares (token embedding and lm_head), read straight from the
target's safetensors, and a target stand-in that carries only them.

A draft rank of a split job trains on hidden states sent by the target ranks; of the target
itself it needs the embedding, the lm_head, the config and the tokenizer. Loading the whole
model for two (V, D) tensors costs an 8B target's full size in host memory and load time on
every draft rank. Here the checkpoint's index (or its one file) says which file holds each
tensor, and only those two are read.

Tensor names come from the model class itself: the model is built on the meta device (no
memory, no weights), its `get_input_embeddings()` / `get_output_embeddings()` name the
parameters, and a tied lm_head is the same parameter as the embedding. A checkpoint written
under another prefix (`model.`, `model.language_model.`, `language_model.model.` of multimodal
releases) is matched by the name's tail and the tensor's (V, D) shape.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from splitserve.assets import resolve_target_path
from splitserve.config import TargetConfig
from splitserve.target.arch import LogitTransform, text_config
from splitserve.target.hf import DTYPES, _info_from_config, hub_kwargs, load_target_config, load_tokenizer

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class SharedWeightsError(ValueError):
    """The target's checkpoint does not hold the shared tensors in a form we can find."""


def meta_model(config: Any, trust_remote_code: bool = False):
    """The target's model class built on the meta device: names and shapes, no memory."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


def module_names(model) -> tuple[str, str, bool]:
    """-> (embedding weight name, lm_head weight name, tied?) in the model's own state dict."""
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    tied = head is embed or bool(getattr(text_config(model.config), "tie_word_embeddings", False))
    return names[id(embed)][0], names[id(head)][-1], tied


def renamer(model):
    """checkpoint key -> the model's name for it, by transformers' own load-time renaming rules
    (GPT-NeoX stores its lm_head as `embed_out`, multimodal releases move the language model).
    Those rules are internal to transformers: where they cannot be read, keys stay as they are."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming, rename_source_key

        rules = get_model_conversion_mapping(model)
        renames = [r for r in rules if isinstance(r, WeightRenaming)]
        converts = [r for r in rules if not isinstance(r, WeightRenaming)]
        meta = model.state_dict()
        prefix = getattr(model, "base_model_prefix", None)
        return lambda key: rename_source_key(key, renames, converts, prefix, meta)[0]
    except Exception:  # another transformers release: fall back to the names' tails and shapes
        return lambda key: key


def _file(path: str, name: str, cfg: TargetConfig) -> str | None:
    from transformers.utils import cached_file

    kw = {k: v for k, v in hub_kwargs(cfg).items() if k == "revision"}
    return cached_file(path, name, _raise_exceptions_for_missing_entries=False, **kw)


def checkpoint_map(path: str, cfg: TargetConfig) -> dict[str, str]:
    """tensor name -> the local safetensors file holding it (sharded via the index, or one file)."""
    index = _file(path, INDEX, cfg)
    if index is not None:
        weight_map = json.loads(open(index).read())["weight_map"]
        files = {f: _file(path, f, cfg) for f in set(weight_map.values())}
        return {k: files[f] for k, f in weight_map.items()}
    single = _file(path, SINGLE, cfg)
    if single is None:
        raise SharedWeightsError(f"target {cfg.path}: no {SINGLE} or {INDEX} (only safetensors checkpoints "
                                 "can be read tensor by tensor)")
    from safetensors import safe_open

    with safe_open(single, "pt") as f:
        return {k: single for k in f.keys()}


def keys_of_shape(ckpt: dict[str, str], shape: tuple[int, int]) -> list[str]:
    """The checkpoint keys whose tensors have `shape`: each file's header is read once, no data."""
    from safetensors import safe_open

    found = []
    for file in sorted(set(ckpt.values())):
        with safe_open(file, "pt") as f:
            found += [k for k in f.keys() if ckpt.get(k) == file and tuple(f.get_slice(k).get_shape()) == shape]
    return found


def _tail(a: str, b: str) -> int:
    """How many trailing dotted components a and b share."""
    pa, pb = a.split("."), b.split(".")
    n = 0
    while n < min(len(pa), len(pb)) and pa[-1 - n] == pb[-1 - n]:
        n += 1
    return n


def find_key(module_name: str, candidates: dict[str, str]) -> str | None:
    """The checkpoint key for `module_name` among `candidates` (checkpoint key -> its name in
    the model, all of the right shape): the one renamed to it, else the one sharing the longest
    tail (at least `<module>.weight`)."""
    exact = [k for k, renamed in candidates.items() if renamed == module_name]
    if len(exact) == 1:
        return exact[0]
    scores = {k: max(_tail(k, module_name), _tail(r, module_name)) for k, r in candidates.items()}
    best = max(scores.values(), default=0)
    top = [k for k, n in scores.items() if n == best]
    return top[0] if best >= 2 and len(top) == 1 else None


def read_shared_weights(cfg: TargetConfig, config: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (embedding (V, D), lm_head (V, D)) in target.dtype, read from the safetensors alone."""
    from safetensors import safe_open

    path = resolve_target_path(cfg.path)
    config = config if config is not None else load_target_config(cfg)
    tc = text_config(config)
    shape = (int(tc.vocab_size), int(tc.hidden_size))
    model = meta_model(config, bool(cfg.trust_remote_code))
    embed_name, head_name, tied = module_names(model)
    ckpt = checkpoint_map(path, cfg)
    rename = renamer(model)
    # Only (V, D) tensors can be either; headers are read, no data.
    candidates = {k: rename(k) for k in keys_of_shape(ckpt, shape)}
    embed_key = find_key(embed_name, candidates)
    if embed_key is None:
        raise SharedWeightsError(f"target {cfg.path}: no checkpoint tensor of shape {shape} is the embedding "
                                 f"({embed_name}); (V, D) tensors: {sorted(candidates) or 'none'}")
    rest = {k: r for k, r in candidates.items() if k != embed_key}
    head_key = find_key(head_name, rest)
    if head_key is None and not tied and len(rest) == 1:
        head_key = next(iter(rest))  # the one other (V, D) tensor
    if head_key is None and not tied:
        raise SharedWeightsError(f"target {cfg.path}: no checkpoint tensor of shape {shape} is the untied lm_head "
                                 f"({head_name}); (V, D) tensors: {sorted(candidates)}")

    def read(key: str) -> torch.Tensor:
        with safe_open(ckpt[key], "pt") as f:
            return f.get_tensor(key).to(DTYPES[cfg.dtype])

    embed = read(embed_key)
    return embed, (read(head_key) if head_key is not None else embed)


class SharedWeightsTarget:
    """A target stand-in for a split job's draft ranks and for export: implements
    `TargetWeights` (target/backend.py), info, config, tokenizer, logit transform and the two
    shared tensors. It runs nothing (records arrive from the target ranks), so it is neither a
    `CaptureTarget` nor a `DecodingTarget`."""

    def __init__(self, cfg: TargetConfig, device: torch.device | None = None):
        if cfg.dtype not in DTYPES:
            raise ValueError(f"target.dtype must be one of {sorted(DTYPES)}, got {cfg.dtype!r}")
        self.config = load_target_config(cfg)
        self.info = _info_from_config(self.config, cfg, cfg.name)
        self.logit_transform = LogitTransform.from_config(self.config)
        self.tokenizer = load_tokenizer(resolve_target_path(cfg.path), **hub_kwargs(cfg))
        embed, head = read_shared_weights(cfg, self.config)
        device = device or torch.device("cpu")
        self._embed, self._head = embed.to(device), head.to(device)

    @property
    def device(self) -> torch.device:
        return self._embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self._embed.dtype

    def embed_weight(self) -> torch.Tensor:
        return self._embed

    def lm_head_weight(self) -> torch.Tensor:
        return self._head
