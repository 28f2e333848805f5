"""Find and load a trained draft: from a training run directory or from an HF export.

    run dir:    draft_arch.json + checkpoints/latest -> trainable weights; shared weights are
                copied from the target
    export dir: config.json (architectures = ["DSparkDraftModel"]) + model.safetensors
Compatibility with the target is checked from metadata alone, before any weight is read.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file

from splitserve.models.build import check_compatible
from splitserve.models.dspark import DSparkArch, DSparkDraft
from splitserve.train.checkpoint import CheckpointError, latest_checkpoint, load_weights

ARCH_FILE = "draft_arch.json"


def save_arch(run_dir: Path, arch: DSparkArch, target_path: str) -> None:
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run_dir) / ARCH_FILE).write_text(json.dumps({"arch": arch.to_dict(), "target_path": target_path}, indent=2))


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


def load_draft(path: str | Path, target, checkpoint: str | Path | None = None) -> DSparkDraft:
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
