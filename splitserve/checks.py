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


def check_group_choices(overrides, cfg) -> None:
    """A group option on the command line that a later group replaced (config.replaced_choices):
    one line, before anything loads."""
    from splitserve.config import replaced_choices
    from splitserve.errors import UserError

    for message in replaced_choices(overrides, cfg):
        raise UserError(message)


def check_run_config(cfg) -> None:
    """The settings of a train or dump run that name a choice or a count, checked before anything
    loads: a UserError naming the key, its value and what it may be (a typo otherwise surfaced
    deep in a step, after the target's weights were read, as a traceback)."""
    from splitserve.errors import UserError
    from splitserve.models.heads import MARKOV_TYPES
    from splitserve.target import BACKENDS
    from splitserve.target.hf import DTYPES
    from splitserve.train.losses import ACCEPTANCES, DISTANCES, LOSSES, WEIGHTINGS

    choices = {
        "target.backend": (cfg.target.backend, BACKENDS),
        "target.dtype": (cfg.target.dtype, tuple(DTYPES)),
        "draft.markov_head_type": (cfg.draft.markov_head_type, MARKOV_TYPES),
        "loss.kind": (cfg.loss.kind, tuple(LOSSES)),
        "loss.weighting": (cfg.loss.weighting, WEIGHTINGS),
        "loss.distance": (cfg.loss.distance, DISTANCES),
        "loss.acceptance": (cfg.loss.acceptance, ACCEPTANCES),
        "train.backend": (cfg.train.backend, ("plain", "deepspeed")),
        "train.precision": (cfg.train.precision, ("fp32", "bf16")),
        "data.overlong": (cfg.data.overlong, ("truncate", "skip")),
    }
    for key, (value, allowed) in choices.items():
        if value not in allowed:
            raise UserError(f"{key}={value!r}: must be one of {', '.join(map(str, allowed))}")
    at_least = {
        "draft.block_size": (cfg.draft.block_size, 1), "draft.num_layers": (cfg.draft.num_layers, 1),
        "draft.markov_rank": (cfg.draft.markov_rank, 0), "train.batch_size": (cfg.train.batch_size, 1),
        "train.anchors_per_seq": (cfg.train.anchors_per_seq, 1),
        "train.grad_accum_steps": (cfg.train.grad_accum_steps, 1),
        "train.max_steps": (cfg.train.max_steps, 0), "data.max_length": (cfg.data.max_length, 2),
    }
    for key, (value, low) in at_least.items():
        if value < low:
            raise UserError(f"{key}={value}: must be at least {low}")
    if not cfg.train.lr > 0:
        raise UserError(f"train.lr={cfg.train.lr}: must be positive")
    if cfg.target.layer_ids is None and cfg.target.num_capture_layers < 1:
        raise UserError(f"target.num_capture_layers={cfg.target.num_capture_layers}: must be at least 1")


def check_target_layers(target_cfg) -> None:
    """The captured layers against the target's config.json alone (no weights are read): the
    default rule can repeat a layer of a small target, and target.layer_ids can name one twice or
    one the target lacks; a UserError names the layer count, the ids and the setting to change.
    An unreadable or unservable config is refused here too, in load_target_config's words."""
    from splitserve.errors import UserError
    from splitserve.target.arch import text_config
    from splitserve.target.hf import load_target_config
    from splitserve.target.layers import check_layer_ids, rule_layer_ids

    num_layers = int(text_config(load_target_config(target_cfg)).num_hidden_layers)
    if num_layers < 2:
        raise UserError(f"target {target_cfg.path}: {num_layers} layer(s); capturing needs at least 2 "
                        "(the last layer is never captured)")
    last = target_cfg.layer_rule == "last"
    if target_cfg.layer_ids is not None:
        check_layer_ids(list(target_cfg.layer_ids), num_layers, from_rule=False, allow_last=last)
    else:
        ids = rule_layer_ids(num_layers, target_cfg.num_capture_layers, target_cfg.layer_rule)
        check_layer_ids(ids, num_layers, from_rule=True, allow_last=last)


def check_draft_target(cfg) -> None:
    """The draft family against the target's config.json alone (no weights are read): its
    resolver's refusals (draft=mtp on a target without MTP layers, ...) come before the target loads."""
    from splitserve.models.build import resolve_arch
    from splitserve.target.hf import load_target_config, peek_target_info

    resolve_arch(cfg.draft, peek_target_info(cfg.target), load_target_config(cfg.target))


def check_train_data(cfg) -> None:
    """Read every data file a train run will use before the target loads: a missing, empty or
    non-UTF-8 file, or one with no usable row, is a one-line DataError naming the file and row.
    A bad row (malformed JSON, not an object, not a known shape) is an error with data.strict;
    otherwise the data loader skips and counts it, so it is let through here."""
    from splitserve.data import resolve_prompts_path, resolve_train_path
    from splitserve.data.prompts import read_prompts
    from splitserve.data.rows import DataError, NotUTF8Error, iter_raw_rows
    from splitserve.data.tokenized import parse_training_row

    if not cfg.data.dump_dir:
        path = resolve_train_path(cfg.data.train_path)
        rows, usable, first_bad = 0, 0, None
        for _, row, where in iter_raw_rows(path):  # an empty or unreadable file raises, named
            rows += 1
            try:
                if isinstance(row, DataError):
                    raise row
                parse_training_row(row, where)
            except DataError as exc:
                # A bad byte means the file is in another encoding: skipping its lines would
                # quietly drop every row with a non-ASCII character, so it stops the run.
                if cfg.data.strict or isinstance(exc, NotUTF8Error):
                    raise
                first_bad = first_bad or exc
                continue
            usable += 1
        if not usable:
            raise DataError(f"{path}: no usable row among {rows} (every row is malformed; the first: {first_bad})")
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


def check_export_dir(out_dir: str, force: bool, source: str | None = None) -> Path:
    """Refuse to write into a non-empty OUT_DIR (a stale file there, e.g. calibration.json, would
    be served with the new weights) unless --force, which replaces it whole; and refuse, whatever
    --force says, an OUT_DIR that is the draft being exported (`source`) or a folder holding it:
    replacing it would delete what is being read."""
    from splitserve.errors import UserError

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"OUT_DIR {out} is a file, not a directory")
    if source is not None and out.exists():
        src = Path(source).resolve()
        if src == out.resolve() or out.resolve() in src.parents:
            raise UserError(f"OUT_DIR {out} holds the draft being exported ({source}); pick another OUT_DIR")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UserError(f"OUT_DIR {out} is not empty; pass --force to replace it")
    return out


