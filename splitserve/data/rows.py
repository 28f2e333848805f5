"""Rows of a data file, whatever it is stored as: JSONL here, columnar formats through `datasets`.

Every row comes with the place it was read from ("file:line" for JSONL, "file: row N" for the
others), so a bad row is reported in one line that names it.

    .jsonl / .json (one object a line)   read line by line
    .parquet, .arrow                     datasets.Dataset.from_parquet / from_file
    a directory from save_to_disk        datasets.load_from_disk (its "train" split if a DatasetDict)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

COLUMNAR = (".parquet", ".arrow")


class DataError(ValueError):
    """Bad user data; the message names the file and line (or the conversation) at fault."""


def iter_json_rows(path: str | Path) -> Iterator[tuple[int, dict, str]]:
    """Yield (1-based line number, object, "path:line") for each non-blank JSONL line."""
    try:
        f = open(path, "rb")  # bytes, so that a bad byte is reported on its own line
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    with f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{where}: not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: malformed JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row, where


def _open_columnar(path: Path) -> Any:
    import datasets

    datasets.disable_progress_bars()
    try:
        if path.is_dir():
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                if "train" not in ds:
                    raise DataError(f"{path}: a DatasetDict without a 'train' split (has {sorted(ds)})")
                ds = ds["train"]
            return ds
        if path.suffix == ".parquet":
            return datasets.Dataset.from_parquet(str(path))
        return datasets.Dataset.from_file(str(path))
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - pyarrow and datasets raise many types for a bad file
        raise DataError(f"{path}: cannot be read as a dataset ({type(e).__name__}: {e})") from None


def iter_rows(path: str | Path) -> Iterator[tuple[int, dict, str]]:
    """Yield (1-based row number, row, where) for each row of a JSONL, Parquet, Arrow or
    save_to_disk data set."""
    p = Path(path)
    if not p.is_dir() and p.suffix not in COLUMNAR:
        yield from iter_json_rows(p)
        return
    if not p.exists():
        raise DataError(f"{p}: no such file or directory")
    for i, row in enumerate(_open_columnar(p), start=1):
        yield i, row, f"{p}: row {i}"
