"""Load the target and the draft for serving: the draft's metadata is checked against the
target's config before any weight is read, so a draft made for another target is refused at
start with every difference named (DraftMismatchError)."""

from __future__ import annotations

from pathlib import Path

import torch

from splitserve.config import TargetConfig
from splitserve.models.build import check_compatible
from splitserve.models.io import load_draft, read_draft_meta
from splitserve.serve.config import ModelsConfig
from splitserve.spec.calibration import load_calibration, temperatures_for


def resolve_dtype(dtype: str, device: str) -> str:
    if dtype != "auto":
        return dtype
    on_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return "bfloat16" if on_cuda else "float32"


def target_config_for(cfg: ModelsConfig) -> tuple[TargetConfig, object]:
    """-> (the target's config with the draft's captured layers, the draft's arch)."""
    arch, _, run_target = read_draft_meta(cfg.draft)
    target_path = cfg.target or run_target or "smollm2-135m"
    tcfg = TargetConfig(name=Path(target_path).name, path=target_path, device=cfg.device,
                        dtype=resolve_dtype(cfg.dtype, cfg.device), layer_ids=list(arch.target_layer_ids),
                        revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
    return tcfg, arch


def load_models(cfg: ModelsConfig):
    """-> (HFTarget, DSparkDraft), both on the target's device and dtype, in eval mode."""
    from splitserve.target.hf import load_hf_target, peek_target_info

    tcfg, arch = target_config_for(cfg)
    check_compatible(arch, peek_target_info(tcfg), where=f"draft {cfg.draft}")
    target = load_hf_target(tcfg)
    draft = load_draft(cfg.draft, target)
    # STS temperatures of the primary calibration fit (calibration.json of the run or export), for
    # confidence-scheduled verification; None: the engine uses the raw c_k.
    draft.confidence_temperatures = temperatures_for(load_calibration(cfg.draft))
    return target, draft
