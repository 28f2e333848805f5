"""Training checkpoints: trainable weights, optimizer, scheduler and data position.

Layout (run_dir/checkpoints/):
    step_0000100/draft.safetensors   trainable weights only (shared ones come from the target)
    step_0000100/optim.pt            optimizer + scheduler state (plain backend)
    step_0000100/deepspeed/          DeepSpeed's own sharded optimizer state (deepspeed backend)
    step_0000100/state.json          step, samples/tokens seen, elapsed time, finished flag
    latest                           name of the newest complete checkpoint
A checkpoint is written to a temp dir and renamed, then `latest` is replaced atomically, so
a run killed at any moment resumes from the last complete one. In a split job every draft
rank takes part (DeepSpeed writes its shards from each rank); draft rank 0 writes the rest.
Ranks share the run directory's filesystem.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from safetensors.torch import load_file, save_file

from splitserve.train.partition import Partition


class CheckpointError(RuntimeError):
    pass


@dataclass
class TrainState:
    step: int = 0
    samples_seen: int = 0
    tokens_seen: int = 0
    positions_trained: int = 0
    elapsed_s: float = 0.0
    finished: bool = False


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


def save_checkpoint(
    run_dir: Path, draft, backend, state: TrainState, keep: int = 2, part: Partition | None = None
) -> Path:
    part = part or Partition()
    root = Path(run_dir) / "checkpoints"
    name = f"step_{state.step:07d}"
    final, tmp = root / name, root / (name + ".tmp")
    if part.writer:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    part.barrier()
    backend.save(tmp, part.writer)
    part.barrier()
    if part.writer:
        weights = {k: v.detach().contiguous().cpu().float() for k, v in draft.trainable_state_dict().items()}
        save_file(weights, str(tmp / "draft.safetensors"))
        _write_json(tmp / "state.json", asdict(state))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        (root / "latest.tmp").write_text(name)
        os.replace(root / "latest.tmp", root / "latest")
        for old in list(checkpoint_dirs(run_dir).values())[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    part.barrier()
    return final


def checkpoint_dirs(run_dir: Path) -> dict[int, Path]:
    """step -> directory of every complete checkpoint of a run (half-written `.tmp` ones left
    out), oldest first."""
    root = Path(run_dir) / "checkpoints"
    done = (p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))
    return {int(p.name.removeprefix("step_")): p for p in sorted(done)}


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    path = pointer.parent / pointer.read_text().strip()
    if not path.is_dir():
        raise CheckpointError(f"{pointer} names {path.name}, which does not exist")
    return path


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
        raise CheckpointError(
            f"checkpoint {path} does not fit this draft: missing={missing[:5]} unexpected={unexpected[:5]}"
        )
    for k, v in weights.items():
        if v.shape != expected[k].shape:
            raise CheckpointError(
                f"checkpoint {path}: {k} has shape {tuple(v.shape)}, draft expects {tuple(expected[k].shape)}"
            )
    draft.load_state_dict(weights, strict=False)


def read_state(ckpt: Path) -> TrainState:
    """The bookkeeping of a checkpoint (step, counters, finished), without touching weights."""
    return TrainState(**json.loads((Path(ckpt) / "state.json").read_text()))


def load_checkpoint(ckpt: Path, draft, backend) -> TrainState:
    load_weights(ckpt, draft)
    try:
        backend.load(ckpt)
        state = read_state(ckpt)
    except Exception as exc:
        raise CheckpointError(f"checkpoint {ckpt} is unreadable: {exc}") from exc
    return state
