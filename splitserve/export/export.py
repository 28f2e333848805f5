"""`splitserve export RUN_DIR OUT_DIR`: a self-contained Hugging Face checkpoint of a draft."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from splitserve.export.hf import DSparkConfig
from splitserve.speculative.calibration_file import CALIBRATION_FILE, temperatures_for


def export_draft(draft, out_dir: str | Path, target_info=None, calibration: dict | None = None) -> Path:
    """Write config.json + model.safetensors (all weights, shared ones included, under `model.`).

    `calibration` (a run's calibration.json) is copied beside them, and its primary STS
    temperatures go into config.json as `confidence_temperatures`.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = DSparkConfig.from_arch(draft.arch)
    config.confidence_temperatures = temperatures_for(calibration)
    if target_info is not None:
        config.target_name = target_info.name
        config.target_vocab_size = target_info.vocab_size
        config.target_hidden_size = target_info.hidden_size
        config.num_target_layers = target_info.num_layers
    config.save_pretrained(out)
    weights = {f"model.{k}": v.detach().contiguous().cpu() for k, v in draft.state_dict().items()}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    if calibration is not None:
        (out / CALIBRATION_FILE).write_text(json.dumps(calibration, indent=1))
    return out
