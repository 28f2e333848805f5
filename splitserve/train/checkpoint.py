"""Writing and resuming training checkpoints: trainable weights, optimizer, scheduler and data
position (reading a run's weights back is models/run_files.py, shared with every loader).

Layout (run_dir/checkpoints/):
    step_0000100/draft.safetensors   trainable weights only (shared ones come from the target)
    step_0000100/optim.pt            optimizer + scheduler state (plain backend)
    step_0000100/deepspeed/          DeepSpeed's own sharded optimizer state (deepspeed backend)
    step_0000100/state.json          step, samples/tokens seen, elapsed time, finished flag (and the
                                     limits it finished under: a rerun with larger ones trains on)
    latest                           name of the newest complete checkpoint
    step_0000200.corrupt/            a checkpoint found unreadable on resume, set aside
A checkpoint is written to a temp dir and renamed, then `latest` is replaced atomically, so
a run killed at any moment resumes from the last complete one. A checkpoint damaged later (a
truncated file, a full disk) is set aside on resume, which then starts from the newest intact
one; `latest` is rewritten whenever it is empty or names a checkpoint that is not there. A
checkpoint of another draft shape is no damage: resume refuses it and leaves it where it is.
In a split job every draft rank takes part (DeepSpeed writes its shards from each rank); draft
rank 0 writes the rest. Ranks share the run directory's filesystem.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from safetensors.torch import save_file

from splitserve.models.run_files import (
    CheckpointError,
    CheckpointMismatchError,
    checkpoint_dirs,
    latest_checkpoint,
    load_weights,
    point_latest,
)
from splitserve.train.partition import Partition


@dataclass
class TrainState:
    step: int = 0
    samples_seen: int = 0
    tokens_seen: int = 0
    positions_trained: int = 0
    elapsed_s: float = 0.0
    finished: bool = False
    # [train.max_steps, train.max_minutes] the run finished under (None: not finished, or a
    # checkpoint written before this field existed)
    finished_under: list | None = None


def reopen_if_extended(state: TrainState, max_steps: int, max_minutes: float | None) -> str | None:
    """A finished run that is resumed with a larger train.max_steps, or (having stopped on its time
    budget) with another train.max_minutes, trains on: clears `finished` and says why. The same
    limits leave it finished, so rerunning a sweep skips the runs that are done."""
    if not state.finished or state.finished_under is None or state.step >= max_steps:
        return None
    old_steps, old_minutes = state.finished_under
    if max_steps > old_steps:
        why = f"train.max_steps {old_steps} -> {max_steps}"
    elif state.step < old_steps and max_minutes != old_minutes:
        why = f"train.max_minutes {old_minutes} -> {max_minutes}"
    else:
        return None
    state.finished, state.finished_under = False, None
    return why


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
        # float32 weights; integer and bool buffers (a draft vocabulary's d2t, t2d) as they are
        weights = {k: (v.float() if v.is_floating_point() else v).detach().contiguous().cpu()
                   for k, v in draft.trainable_state_dict().items()}
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


def read_state(ckpt: Path) -> TrainState:
    """The bookkeeping of a checkpoint (step, counters, finished), without touching weights."""
    return TrainState(**json.loads((Path(ckpt) / "state.json").read_text()))


def resume_checkpoint(run_dir: Path, draft, backend, part: Partition | None = None) -> tuple[TrainState, Path] | None:
    """Load the newest intact checkpoint -> (its state, its directory), None when there is none.

    A checkpoint that fails to load (CheckpointError) is reported in one line, renamed to
    `<name>.corrupt` by the writer rank (kept for inspection, never loaded again) and the next
    older one is tried; `latest` is pointed at the one that loaded. Loading writes the draft and
    the backend whole, so a checkpoint that failed halfway leaves nothing behind once an older
    one loads. When none loads, a CheckpointError (training from scratch must be asked for).
    A checkpoint of another draft shape (CheckpointMismatchError) is intact, so it is refused
    as it is, nothing renamed: the run's own config can still resume it."""
    part = part or Partition()
    root = Path(run_dir) / "checkpoints"
    first = latest_checkpoint(run_dir)
    if first is None:
        return None
    candidates = [p for step, p in sorted(checkpoint_dirs(run_dir).items(), reverse=True)
                  if step <= int(first.name.removeprefix("step_"))]
    for ckpt in candidates:
        try:
            state = load_checkpoint(ckpt, draft, backend)
        except CheckpointMismatchError as exc:
            raise CheckpointMismatchError(f"{run_dir} holds checkpoints of another draft architecture ({exc}); "
                                          "use a new run_dir or the run's original draft config") from None
        except CheckpointError as exc:
            older = [p.name for p in candidates if p.name < ckpt.name]
            if part.writer:
                print(f"[train] checkpoint {ckpt.name} is unreadable, set aside as {ckpt.name}.corrupt; "
                      f"{'resuming from ' + older[0] if older else 'no older one'} ({exc})")
                shutil.rmtree(root / f"{ckpt.name}.corrupt", ignore_errors=True)
                os.replace(ckpt, root / f"{ckpt.name}.corrupt")
            continue
        if part.writer:
            point_latest(root, ckpt.name)
        return state, ckpt
    # Every checkpoint failed: starting fresh would silently drop the run's progress.
    if part.writer:
        point_latest(root, None)
    raise CheckpointError(f"no checkpoint of {run_dir} is readable (set aside as *.corrupt); "
                          "remove its checkpoints/ directory to train from scratch")


def load_checkpoint(ckpt: Path, draft, backend) -> TrainState:
    load_weights(ckpt, draft)
    try:
        backend.load(ckpt)
        state = read_state(ckpt)
    except Exception as exc:
        raise CheckpointError(f"checkpoint {ckpt} is unreadable: {exc}") from exc
    return state
