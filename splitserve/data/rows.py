"""Rows of a data set, whatever it is stored as: JSON lines here, columnar formats through `datasets`.

Every row comes with the place it was read from ("file:line" for JSON lines, "file: row N" for the
others), so a bad row is reported in one line that names it.

    .jsonl / .json (one object a line)   read line by line
    .json holding one array of objects   json.load
    .parquet, .arrow                     datasets.Dataset.from_parquet / from_file
    a directory from save_to_disk        datasets.load_from_disk (its "train" split if a DatasetDict)
    a glob ("data/*.parquet")            its matches, in sorted order, one after another

A UTF-8 byte order mark at the start of a JSON file (Windows tools write one) is skipped.

A file-level fault (missing, unreadable, empty, unknown format) is a `DataError`. A row-level fault
(malformed JSON, a line that is not an object, a line that is not UTF-8) is yielded as a `DataError`
in place of the row by `iter_raw_rows`, so a reader that tolerates bad rows can count it and go on;
`iter_rows` raises it. A line that is not UTF-8 is a `NotUTF8Error`, so that a reader can treat the
file's encoding as wrong rather than the row.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Any, Iterator

JSON_LINES = (".jsonl", ".json")
COLUMNAR = (".parquet", ".arrow")
FORMATS = "JSON lines (.jsonl/.json), a JSON array (.json), Parquet, Arrow, or a save_to_disk directory"
BOM = b"\xef\xbb\xbf"  # UTF-8 byte order mark


class DataError(ValueError):
    """Bad user data; the message names the file and line (or the conversation) at fault."""


class NotUTF8Error(DataError):
    """A line (or file) that is not UTF-8: most often a whole file saved in another encoding."""


RawRow = tuple[int, "dict | DataError", str]  # (1-based row number, the row or what is wrong with it, where)


def is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def expand(path: str | Path) -> list[Path]:
    """The files a data path names: itself, or a glob's sorted matches (none is an error)."""
    text = str(path)
    if not is_glob(text):
        return [Path(text)]
    matches = sorted(Path(p) for p in glob.glob(text, recursive=True))
    if not matches:
        raise DataError(f"{text}: the pattern matches no file")
    return matches


def _json_array(path: Path, text: str) -> Iterator[RawRow]:
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: malformed JSON array ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(rows, list):
        raise DataError(f"{path}: expected a JSON array of objects, got {type(rows).__name__}")
    for i, row in enumerate(rows, start=1):
        where = f"{path}: row {i}"
        if isinstance(row, dict):
            yield i, row, where
        else:
            yield i, DataError(f"{where}: expected a JSON object, got {type(row).__name__}"), where


def iter_raw_json_rows(path: str | Path) -> Iterator[RawRow]:
    """JSON lines (or one JSON array, recognised by its leading '['), bad rows yielded as errors."""
    path = Path(path)
    try:
        f = open(path, "rb")  # bytes, so that a bad byte is reported on its own line
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror})") from None
    with f:
        start = len(BOM) if f.read(len(BOM)) == BOM else 0  # read as utf-8-sig: a leading BOM is not data
        f.seek(start)
        head = f.read(4096).lstrip()
        f.seek(start)
        if head.startswith(b"["):
            try:
                text = f.read().decode("utf-8")
            except UnicodeDecodeError as e:
                raise NotUTF8Error(f"{path}: not UTF-8 text (byte offset {start + e.start})") from None
            yield from _json_array(path, text)
            return
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield lineno, NotUTF8Error(
                    f"{where}: not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1})"), where
                continue
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                yield lineno, DataError(f"{where}: malformed JSON ({e.msg} at column {e.colno})"), where
                continue
            if not isinstance(row, dict):
                yield lineno, DataError(f"{where}: expected a JSON object, got {type(row).__name__}"), where
                continue
            yield lineno, row, where


def _strict(rows: Iterator[RawRow]) -> Iterator[tuple[int, dict, str]]:
    for i, row, where in rows:
        if isinstance(row, DataError):
            raise row
        yield i, row, where


def iter_json_rows(path: str | Path) -> Iterator[tuple[int, dict, str]]:
    """Yield (1-based line number, object, "path:line") for each non-blank JSONL line; a bad line raises."""
    yield from _strict(iter_raw_json_rows(path))


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


def _iter_one(p: Path) -> Iterator[RawRow]:
    if not p.exists():
        raise DataError(f"{p}: no such file or directory")
    if p.is_dir() or p.suffix in COLUMNAR:
        for i, row in enumerate(_open_columnar(p), start=1):
            yield i, row, f"{p}: row {i}"
    elif p.suffix in JSON_LINES:
        yield from iter_raw_json_rows(p)
    else:
        raise DataError(f"{p}: unknown data format '{p.suffix or p.name}' (expected {FORMATS})")


def iter_raw_rows(path: str | Path) -> Iterator[RawRow]:
    """Every row of a data path (a file, directory or glob), bad rows yielded as `DataError`s.

    A file with no rows at all is an error: it is almost always the wrong path or a failed export.
    """
    for p in expand(path):
        n = 0
        for n, raw in enumerate(_iter_one(p), start=1):
            yield raw
        if n == 0:
            raise DataError(f"{p}: empty (no rows)")


def iter_rows(path: str | Path) -> Iterator[tuple[int, dict, str]]:
    """Yield (1-based row number, row, where) for each row of a data path; a bad row raises."""
    yield from _strict(iter_raw_rows(path))


def fingerprint(path: str | Path) -> list[tuple[str, int, int]]:
    """(file, size, mtime in ns) of every file a data path reads: what a tokenization cache keys on."""
    out: list[tuple[str, int, int]] = []
    for p in expand(path):
        files = sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]
        for q in files:
            st = q.stat()
            out.append((str(q.resolve()), st.st_size, st.st_mtime_ns))
    return out
