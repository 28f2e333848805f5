"""A training run directory as a reader sees it: what the draft is, and its trained weights.

    run_dir/draft_arch.json                          the draft's family, its arch and its target's path
    run_dir/checkpoints/step_0000100/draft.safetensors   trainable weights (shared ones: the target's)
    run_dir/checkpoints/latest                       name of the newest complete checkpoint
train/checkpoint.py writes checkpoints (with optimizer state) and resumes from them; the loaders
of every command (loading.py) read them through here, without the training package.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from safetensors.torch import load_file

from splitserve.errors import UserError


class CheckpointError(RuntimeError):
    pass


class CheckpointMismatchError(CheckpointError):
    """A checkpoint that reads fine but holds weights of another draft shape: made by another
    draft config, not damaged, so it must never be set aside as corrupt."""


ARCH_FILE = "draft_arch.json"  # run_dir/draft_arch.json: the draft's shapes and its target


def save_arch(run_dir: Path, arch, target_path: str, family: str = "dspark") -> None:
    """arch: the family's arch dataclass, whose to_dict() is written (models/families.py)."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    meta = {"family": family, "arch": arch.to_dict(), "target_path": target_path}
    (Path(run_dir) / ARCH_FILE).write_text(json.dumps(meta, indent=2))


def check_arch(run_dir: Path, arch, family: str = "dspark") -> None:
    """Refuse to reuse a run directory whose draft_arch.json records another draft than `arch`
    of `family`: another family with another arch, or any field that differs, each named. A
    file without a family (written before families) is a DSpark draft's. Reads only, so a
    refusal leaves the run as it was. A missing or unreadable file is no refusal: resume then
    checks the checkpoints' own weights against the draft."""
    path = Path(run_dir) / ARCH_FILE
    if not path.exists():
        return
    try:  # through from_dict, so a field added since the run was made compares as its default
        meta = json.loads(path.read_text())
        saved_family = meta.get("family", "dspark")
        if saved_family != family and set(meta["arch"]) != set(arch.to_dict()):
            raise UserError(f"run_dir {run_dir} holds a {saved_family} draft, not a {family} one; "
                            "use a new run_dir or the run's original draft config")
        saved = type(arch).from_dict(meta["arch"]).to_dict()
    except (OSError, ValueError, KeyError, TypeError) as exc:  # JSONDecodeError is a ValueError
        print(f"[train] {path} is unreadable ({exc}); checking the checkpoints against the draft instead")
        return
    wanted = arch.to_dict()
    diffs = [f"{k} {saved[k]!r} in the run vs {v!r} requested" for k, v in wanted.items() if saved[k] != v]
    if diffs:
        raise UserError(f"run_dir {run_dir} holds a draft of another architecture ({'; '.join(diffs)}); "
                        "use a new run_dir or the run's original draft config")


STEP_DIR = re.compile(r"step_(\d+)")


def checkpoint_dirs(run_dir: Path) -> dict[int, Path]:
    """step -> directory of every complete checkpoint of a run (half-written `.tmp` and set-aside
    `.corrupt` ones left out), oldest first."""
    root = Path(run_dir) / "checkpoints"
    done = (p for p in root.glob("step_*") if p.is_dir() and STEP_DIR.fullmatch(p.name))
    return {int(p.name.removeprefix("step_")): p for p in sorted(done)}


def point_latest(root: Path, name: str | None) -> None:
    if name is None:
        (root / "latest").unlink(missing_ok=True)
        return
    (root / "latest.tmp").write_text(name)
    os.replace(root / "latest.tmp", root / "latest")


def _read_pointer(pointer: Path) -> str:
    """The name `latest` holds; "" when it holds nothing usable (empty, unreadable)."""
    try:
        return pointer.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint `latest` names. If it names none that is there (empty, deleted by hand, set
    aside, not a step_* name), the newest complete one is taken and `latest` is rewritten to name
    it (or removed when there is none), so the pointer never names a missing checkpoint for long.
    A missing `latest` beside complete checkpoints (a run killed between renaming its first
    checkpoint in and writing the pointer) is read the same way."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest"
    has_pointer = pointer.exists()
    name = _read_pointer(pointer) if has_pointer else ""
    # Only a step_* name: an empty one would otherwise make root itself the checkpoint.
    if STEP_DIR.fullmatch(name) and (root / name).is_dir():
        return root / name
    dirs = list(checkpoint_dirs(run_dir).values())
    if not has_pointer and not dirs:
        return None
    named = (f"named {name}, which is not a complete checkpoint" if name
             else "is empty" if has_pointer else "is missing")
    newest = dirs[-1] if dirs else None
    point_latest(root, newest.name if newest else None)
    print(f"[checkpoint] {pointer} {named}; "
          + (f"now {newest.name}" if newest else "no checkpoint left, starting fresh"))
    return newest


def load_weights(ckpt: Path, draft) -> None:
    """Load trainable weights into `draft`; a corrupt or mismatched file is a clear error."""
    path = Path(ckpt) / "draft.safetensors"
    try:
        weights = load_file(str(path))
    except Exception as exc:  # safetensors raises several types for damaged files
        raise CheckpointError(f"checkpoint file {path} is unreadable (truncated or corrupt): {exc}") from exc
    expected = draft.trainable_state_dict()
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise CheckpointMismatchError(
            f"checkpoint {path} does not fit this draft: missing={missing[:5]} unexpected={unexpected[:5]}"
        )
    for k, v in weights.items():
        if v.shape != expected[k].shape:
            raise CheckpointMismatchError(
                f"checkpoint {path}: {k} has shape {tuple(v.shape)}, draft expects {tuple(expected[k].shape)}"
            )
    draft.load_state_dict(weights, strict=False)
