"""The target's own MTP weights, read from its checkpoint in the MTP draft's names (models/mtp.py).

transformers drops a target's MTP layers when it loads the model (DeepSeek-V3 and Qwen3-Next
list them as unexpected keys to ignore), so they are read here from the safetensors, under the
layout's prefixes (models/mtp.py MtpLayout). The head's own tensors (enorm, hnorm, eh_proj / fc,
the output norm) are copied by name. The decoder layers are stored in the checkpoint's format,
which transformers converts on load (a MoE's per-expert matrices become one fused tensor): they
are renamed to the layers of a K-layer model of the target's class and loaded by transformers'
own `from_pretrained`, so every conversion is the one the target itself gets. The frozen copy
of the target's final norm comes from the loaded target.

A checkpoint whose config declares MTP layers but whose weights lack them (HF conversions often
drop them) is refused in one line naming the missing prefix.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from splitserve.config import TargetConfig
from splitserve.errors import UserError
from splitserve.models.mtp import MtpArch, block_config
from splitserve.target.shared_weights import checkpoint_map


def read_mtp_state(target: Any, arch: MtpArch) -> dict[str, torch.Tensor]:
    """target: an HFTarget loaded from a checkpoint directory -> the MTP draft's state dict, less
    the shared embedding and lm_head: heads.*, blocks.*, out_norms.*, target_norm.*."""
    path = str(getattr(target.model.config, "_name_or_path", "") or "")
    if not path:
        raise UserError(f"draft=mtp: target {target.info.name} was not loaded from a checkpoint, so its MTP "
                        "weights cannot be read (transformers does not load them)")
    ckpt = checkpoint_map(path, TargetConfig(name=target.info.name, path=path))
    layout, n = arch.layout, arch.target_num_layers
    heads = layout.head_keys(n)
    blocks = [layout.block_prefix(k, n) for k in range(layout.num_layers)]
    absent = [p + "*" for p in blocks if not any(key.startswith(p) for key in ckpt)] + \
             [key for key in heads if key not in ckpt]
    if absent:
        raise UserError(f"draft=mtp: target {target.info.name}'s config declares {layout.num_layers} MTP layer(s) "
                        f"({layout.field}={layout.num_layers}) but its checkpoint {path} has no {absent[0]}"
                        f"{f' (and {len(absent) - 1} more)' if len(absent) > 1 else ''}: a conversion dropped "
                        "them; use a checkpoint that keeps its MTP weights")
    from safetensors import safe_open

    def read(key: str) -> torch.Tensor:
        with safe_open(ckpt[key], "pt") as f:
            return f.get_tensor(key)

    state = {name: read(key) for key, name in heads.items()}
    skip = tuple(heads) + layout.extra_prefixes(n)
    layers = {f"model.layers.{k}.{key[len(p):]}": read(key)
              for k, p in enumerate(blocks) for key in ckpt if key.startswith(p) and not key.startswith(skip)}
    for k, layer in enumerate(_converted_layers(arch, layers)):
        state |= {f"blocks.{k}.{name}": v for name, v in layer.state_dict().items()}
    norm = getattr(target.decoder, "norm", None)
    if norm is None:
        raise UserError(f"draft=mtp: {type(target.decoder).__name__} has no final norm `norm` to copy")
    state |= {f"target_norm.{name}": v.detach().clone() for name, v in norm.state_dict().items()}
    return state


def _converted_layers(arch: MtpArch, layers: dict[str, torch.Tensor]) -> list[torch.nn.Module]:
    """The K decoder layers loaded by transformers from `layers` (checkpoint format, named as the
    layers of a K-layer model of the target's class)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    config = block_config(arch)
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        save_file({k: v.contiguous() for k, v in layers.items()}, str(Path(tmp) / "model.safetensors"))
        model, info = AutoModelForCausalLM.from_pretrained(tmp, config=config, dtype=torch.float32,
                                                           output_loading_info=True)
    missing = [k for k in info["missing_keys"] if ".layers." in k]
    unexpected = list(info["unexpected_keys"])
    if missing or unexpected:
        raise UserError(f"draft=mtp: the checkpoint's MTP decoder layers do not fit {type(model).__name__}'s: "
                        f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    return list(model.get_decoder().layers)
