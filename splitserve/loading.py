"""Find and load a trained draft and its target: the one loader every command uses.

    run dir:    draft_arch.json + checkpoints/latest -> trainable weights; shared weights are
                copied from the target
    export dir: config.json (architectures = ["DSparkDraftModel"]) + model.safetensors
The draft's metadata is checked against the target's config before any weight is read, so a
draft made for another target is refused at start with every difference named
(DraftMismatchError)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from splitserve.config import ModelsConfig, TargetConfig
from splitserve.models.build import check_compatible
from splitserve.models.dspark import DSparkArch, DSparkDraft
from splitserve.speculative.calibration_file import load_calibration, temperatures_for
from splitserve.target.backend import TargetWeights
from splitserve.train.checkpoint import ARCH_FILE, CheckpointError, latest_checkpoint, load_weights


def read_draft_meta(path: str | Path) -> tuple[DSparkArch, str, str | None]:
    """-> (arch, kind "run" | "export", the run's target path or None)."""
    path = Path(path)
    if (path / ARCH_FILE).exists():
        meta = json.loads((path / ARCH_FILE).read_text())
        return DSparkArch.from_dict(meta["arch"]), "run", meta.get("target_path")
    if (path / "config.json").exists():
        from splitserve.export.hf import ARCHITECTURE, DSparkConfig

        raw = json.loads((path / "config.json").read_text())
        if ARCHITECTURE not in (raw.get("architectures") or []):
            raise ValueError(f"{path}/config.json is not a DSpark draft (architectures={raw.get('architectures')})")
        return DSparkConfig.from_pretrained(path).to_arch(), "export", None
    raise FileNotFoundError(
        f"{path} is neither a splitserve run directory ({ARCH_FILE}) nor a DSpark export (config.json)"
    )


def load_draft(path: str | Path, target: TargetWeights, checkpoint: str | Path | None = None) -> DSparkDraft:
    """`checkpoint`: a run's checkpoint directory to load instead of its latest."""
    arch, kind, _ = read_draft_meta(path)
    check_compatible(arch, target.info, where=f"draft {path}")
    draft = DSparkDraft(arch)
    if kind == "run":
        ckpt = Path(checkpoint) if checkpoint is not None else latest_checkpoint(Path(path))
        if ckpt is None:
            raise CheckpointError(f"run {path} has no checkpoint yet")
        draft.load_shared(target.embed_weight(), target.lm_head_weight())
        load_weights(ckpt, draft)
    else:
        file = Path(path) / "model.safetensors"
        try:
            weights = load_file(str(file))
        except Exception as exc:
            raise CheckpointError(f"{file} is unreadable (truncated or corrupt): {exc}") from exc
        state = {k.removeprefix("model."): v for k, v in weights.items()}
        missing, unexpected = draft.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise CheckpointError(f"{file} does not fit its config: missing={missing[:5]} unexpected={unexpected[:5]}")
    return draft.to(device=target.device, dtype=target.dtype).eval()


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
