"""Checks the CLI runs before any weights load, and what counts as a user error.

Each check reads only what it must (a data file's rows, a draft's metadata, a directory listing)
and raises a one-line error naming the file, row or flag; the CLI prints it and exits 1. Imports
sit inside the functions so that `splitserve --help` and the argument parsing stay cheap.
"""

from __future__ import annotations

from pathlib import Path


def user_error_types() -> tuple[type[BaseException], ...]:
    """The exceptions that mean "the user can fix this": printed as one line, no traceback."""
    from splitserve.assets import AssetError
    from splitserve.data.rows import DataError
    from splitserve.errors import UserError
    from splitserve.models.build import DraftMismatchError
    from splitserve.models.run_files import CheckpointError
    from splitserve.split.routing import SplitConfigError
    from splitserve.stream.dump_reader import DumpError
    from splitserve.target.arch import UnsupportedTargetError

    return (UserError, DataError, DraftMismatchError, CheckpointError, AssetError, DumpError, SplitConfigError,
            UnsupportedTargetError)


def check_train_data(cfg) -> None:
    """Read every data file a train run will use before the target loads: a missing, empty,
    non-UTF-8 or malformed file is a one-line DataError naming the file and row."""
    from splitserve.data import resolve_prompts_path, resolve_train_path
    from splitserve.data.prompts import read_prompts
    from splitserve.data.rows import DataError, iter_rows

    if not cfg.data.dump_dir:
        path = resolve_train_path(cfg.data.train_path)
        for _ in iter_rows(path):  # an empty file, or a bad byte or line anywhere, named by its row
            pass
    if cfg.eval.enabled:
        path = resolve_prompts_path(cfg.data.heldout_prompts)
        if not read_prompts(path):
            raise DataError(f"{path}: no prompts (the file is empty); data.heldout_prompts must name prompts")


def draft_meta(path: str, flag: str):
    """read_draft_meta with its errors as one-line UserErrors naming the flag."""
    from splitserve.errors import UserError
    from splitserve.loading import read_draft_meta

    try:
        return read_draft_meta(path)
    except (FileNotFoundError, ValueError, KeyError) as exc:  # JSONDecodeError is a ValueError
        raise UserError(f"{flag} {path}: {exc}") from None


def check_prompts(name: str, flag: str) -> None:
    """A prompts file read in full before any model loads (missing, empty, bad rows)."""
    from splitserve.data import resolve_prompts_path
    from splitserve.data.prompts import read_prompts
    from splitserve.data.rows import DataError

    try:
        path = resolve_prompts_path(name)
        prompts = read_prompts(path)
    except DataError as exc:  # named by the flag that brought the file in
        raise DataError(f"{flag} {exc}") from None
    if not prompts:
        raise DataError(f"{flag} {path}: no prompts (the file is empty)")


def check_export_dir(out_dir: str, force: bool) -> Path:
    """Refuse to write into a non-empty OUT_DIR (a stale file there, e.g. calibration.json, would
    be served with the new weights) unless --force, which replaces it whole."""
    from splitserve.errors import UserError

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"OUT_DIR {out} is a file, not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UserError(f"OUT_DIR {out} is not empty; pass --force to replace it")
    return out


