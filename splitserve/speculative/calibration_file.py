"""calibration.json, the file that carries a draft's STS temperatures (speculative/calibrate.py) from
the evaluation that fitted them to the engine and the exports that use them.

    {"version": 1, "method": "sts", "n_bins": 10, "source": "...", "fits": [{"sampling_temperature": T,
     "temperatures": [T_1, ..., T_γ], ...}, ...]}
One fit per sampling temperature evaluated; the first is the primary one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

CALIBRATION_FILE = "calibration.json"
VERSION = 1


def write_calibration(run_dir: str | Path, fits: list[dict], n_bins: int, source: str) -> Path:
    path = Path(run_dir) / CALIBRATION_FILE
    path.write_text(json.dumps({"version": VERSION, "method": "sts", "n_bins": n_bins, "source": source,
                                "fits": fits}, indent=1))
    return path


def load_calibration(path: str | Path) -> dict | None:
    """calibration.json of a run or export directory, or None if it has none."""
    file = Path(path) / CALIBRATION_FILE
    return json.loads(file.read_text()) if file.exists() else None


def temperatures_for(calibration: dict | None, sampling_temperature: float | None = None) -> list[float] | None:
    """The fitted per-position temperatures for a sampling temperature (default: the primary fit)."""
    if not calibration or not calibration.get("fits"):
        return None
    fits = calibration["fits"]
    if sampling_temperature is not None:
        for f in fits:
            if math.isclose(f["sampling_temperature"], sampling_temperature):
                return f["temperatures"]
    return fits[0]["temperatures"]
