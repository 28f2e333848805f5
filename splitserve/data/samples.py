"""Training samples from a data path: rows -> token ids + assistant masks, through `datasets.map`.

Tokenizing is done once per (data files, tokenizer, chat template, kwargs, max_length, limit) and
kept under `<splitserve cache>/tokenized/<key>/`; a later run, or another rank of the same split
job, reads it back instead. A file lock next to the entry makes the first process to arrive do the
work while the others wait for it, so a split job needs no process group for this.

Bad rows do not stop a run: a row that is not valid JSON or not a known shape, or whose assistant
turns the template does not let us locate, is skipped and counted with where it was; `strict`
turns the first one into a `DataError` naming the file and row instead. A file-level fault
(missing, unreadable, empty, unknown format) is always an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from splitserve.data.chat import DEFAULT, LOSS_ON, ChatTemplate, TokenizedSample, tokenize_conversation
from splitserve.data.concat import concatenate
from splitserve.data.rows import DataError, fingerprint, iter_raw_rows
from splitserve.data.tokenized import parse_training_row, tokenized_sample

CACHE_VERSION = 1  # bump when the masks a given input yields change
SHOWN_PER_REASON = 5  # row locations listed per skip reason in the summary
# no trainable token | bad row | replies not found | longer than max_length (with overlong="skip")
REASONS = ("empty", "malformed", "unlocated", "long")
REASON_WORDS = {"empty": "with no assistant reply to learn from", "malformed": "malformed",
                "unlocated": "whose replies the chat template does not reproduce",
                "long": "longer than data.max_length (data.overlong=skip)"}
OVERLONG = ("truncate", "skip")


@dataclass
class LoadOptions:
    chat: ChatTemplate = DEFAULT
    strict: bool = False  # the first bad row is an error instead of a skip
    num_proc: int | None = None  # datasets.map worker processes (None: this process)
    cache: bool = False  # keep the tokenized samples under the splitserve cache dir
    overlong: str = "truncate"  # a row longer than max_length: cut to it and counted | skipped and counted
    concat_to: int = 0  # consecutive conversations joined into rows of at most this many tokens (data/concat.py)
    loss_on: str = "assistant"  # the tokens the draft learns to predict: assistant replies | all

    def __post_init__(self):
        if self.overlong not in OVERLONG:
            raise DataError(f"data.overlong must be one of {', '.join(OVERLONG)}, got {self.overlong!r}")
        if self.loss_on not in LOSS_ON:
            raise DataError(f"data.loss_on must be one of {', '.join(LOSS_ON)}, got {self.loss_on!r}")


@dataclass
class DataStats:
    rows: int = 0  # rows read, bad ones included
    samples: int = 0
    truncated: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    skipped: dict[str, list[str]] = field(default_factory=dict)  # reason -> where each row was
    cached: bool = False  # read back from the cache rather than tokenized now
    joined: int = 0  # conversations joined into `samples` rows by data.concat_to (0: none)

    @property
    def skipped_empty(self) -> int:
        return len(self.skipped.get("empty", []))

    def skip(self, reason: str, where: str) -> None:
        self.skipped.setdefault(reason, []).append(where)

    def summary(self) -> str:
        """One line in words: rows read and used, each skip reason with its count (and where, for
        the faulty ones), truncations and tokens."""
        skipped = []
        for reason in REASONS:
            where = self.skipped.get(reason, [])
            if where:
                shown = ", ".join(where[:SHOWN_PER_REASON]) + (", ..." if len(where) > SHOWN_PER_REASON else "")
                quiet = reason in ("empty", "long")  # not faults: no row list
                skipped.append(f"{len(where)} {REASON_WORDS[reason]}" + ("" if quiet else f" at {shown}"))
        parts = [f"{self.rows} rows read, {self.joined or self.samples} used"]
        parts.append("skipped: " + "; ".join(skipped) if skipped else "none skipped")
        parts.append(f"{self.truncated} cut to data.max_length")
        if self.joined:
            parts.append(f"joined into {self.samples} rows of up to data.concat_to tokens")
        parts.append(f"{self.tokens:,} tokens ({self.loss_tokens:,} trained)" + (", from cache" if self.cached else ""))
        return "; ".join(parts)


# --------------------------------------------------------------------------- tokenizing


def _tokenize_row(row: dict, tokenizer: Any, max_length: int, chat: ChatTemplate, loss_on: str = "assistant") -> dict:
    """datasets.map function: one row -> ids, mask, and why it was skipped ("" if kept)."""
    out = {"input_ids": [], "loss_mask": [], "truncated": False, "skip": "", "error": row["error"]}
    if row["error"]:
        return {**out, "skip": "malformed"}
    parsed = json.loads(row["messages"])
    tokenized = isinstance(parsed, dict)  # a pre-tokenized row (data/tokenized.py); a chat is a list
    try:
        sample = (tokenized_sample(parsed, len(tokenizer), max_length, loss_on, row["where"]) if tokenized
                  else tokenize_conversation(tokenizer, parsed, max_length, row["where"], chat, loss_on))
    except DataError as e:  # an id past the vocabulary | replies the template does not reproduce
        return {**out, "skip": "malformed" if tokenized else "unlocated", "error": str(e)}
    if sample is None:
        return {**out, "skip": "empty"}
    return {**out, "input_ids": sample.input_ids, "loss_mask": sample.loss_mask, "truncated": sample.truncated}


def _chunks(path: str | Path, strict: bool, size: int | None) -> Iterator[dict[str, list]]:
    """Columns {"where", "messages" (JSON text), "error"} of up to `size` rows at a time, in file
    order; a bad row carries its error (raised here when strict)."""
    chunk: dict[str, list] = {"where": [], "messages": [], "error": []}
    for _i, row, where in iter_raw_rows(path):
        text, error = "", ""
        try:
            if isinstance(row, DataError):
                raise row
            # JSON text: rows of one file may differ in shape (extra fields, tool calls), which an
            # Arrow column of structs would refuse. A pre-tokenized row is an object, a chat a list.
            text = json.dumps(parse_training_row(row, where), ensure_ascii=False)
        except DataError as e:
            if strict:
                raise
            error = str(e)
        for key, value in (("where", where), ("messages", text), ("error", error)):
            chunk[key].append(value)
        if size is not None and len(chunk["where"]) >= size:
            yield chunk
            chunk = {"where": [], "messages": [], "error": []}
    if chunk["where"]:
        yield chunk


def _tokenize(path: str | Path, tokenizer: Any, max_length: int, limit: int | None, opts: LoadOptions):
    import datasets

    datasets.disable_progress_bars()
    stats = DataStats()
    samples: list[TokenizedSample] = []
    # With a limit, rows are tokenized a slice at a time so that a small limit reads little.
    size = None if limit is None else max(2 * limit, 64)
    for chunk in _chunks(path, opts.strict, size):
        ds = datasets.Dataset.from_dict(chunk)
        num_proc = opts.num_proc if opts.num_proc and opts.num_proc > 1 and len(ds) > 1 else None
        done = ds.map(_tokenize_row, fn_kwargs={"tokenizer": tokenizer, "max_length": max_length,
                                                "chat": opts.chat, "loss_on": opts.loss_on},
                      num_proc=num_proc, remove_columns=["messages"], load_from_cache_file=False,
                      desc="tokenize").to_dict()
        for where, skip, error, ids, mask, truncated in zip(
            done["where"], done["skip"], done["error"], done["input_ids"], done["loss_mask"], done["truncated"]
        ):
            if limit is not None and len(samples) >= limit:
                break
            stats.rows += 1
            if truncated and opts.overlong == "skip":
                skip = "long"
            if skip:
                if opts.strict and skip not in ("empty", "long"):
                    raise DataError(error)
                if error and len(stats.skipped.get(skip, [])) < SHOWN_PER_REASON:
                    print(f"[data] skipped: {error}")
                stats.skip(skip, where)
                continue
            samples.append(TokenizedSample(ids, mask, where, truncated))
            stats.samples += 1
            stats.truncated += int(truncated)
            stats.tokens += len(ids)
            stats.loss_tokens += sum(mask)
        if limit is not None and len(samples) >= limit:
            break
    return samples, stats


# --------------------------------------------------------------------------- caching


def _tokenizer_identity(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        blob = backend.to_str()
    else:
        from datasets.fingerprint import Hasher

        blob = Hasher.hash(tokenizer)
    return hashlib.sha256(f"{type(tokenizer).__name__}\n{blob}".encode()).hexdigest()


def cache_key(path: str | Path, tokenizer: Any, max_length: int, limit: int | None, opts: LoadOptions) -> str:
    parts = {
        "version": CACHE_VERSION, "files": fingerprint(path), "tokenizer": _tokenizer_identity(tokenizer),
        "template": opts.chat.text_for(tokenizer), "kwargs": opts.chat.kwargs, "max_length": max_length,
        "limit": limit, "strict": opts.strict,
    }
    if opts.overlong != "truncate":  # keys of earlier caches stay as they were
        parts["overlong"] = opts.overlong
    if opts.loss_on != "assistant":
        parts["loss_on"] = opts.loss_on
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _save(entry: Path, samples: list[TokenizedSample], stats: DataStats) -> None:
    import datasets

    tmp = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    cols = {"input_ids": [s.input_ids for s in samples], "loss_mask": [s.loss_mask for s in samples],
            "source": [s.source for s in samples], "truncated": [s.truncated for s in samples]}
    datasets.Dataset.from_dict(cols).save_to_disk(str(tmp / "samples"))
    (tmp / "stats.json").write_text(json.dumps(asdict(stats)))
    # Renamed into place whole, so a reader never sees a half-written entry.
    os.replace(tmp, entry)


def _load(entry: Path) -> tuple[list[TokenizedSample], DataStats]:
    import datasets

    ds = datasets.load_from_disk(str(entry / "samples"))
    cols = ds.to_dict()
    samples = [TokenizedSample(i, m, s, t) for i, m, s, t in
               zip(cols["input_ids"], cols["loss_mask"], cols["source"], cols["truncated"])]
    stats = DataStats(**{**json.loads((entry / "stats.json").read_text()), "cached": True})
    return samples, stats


def load_samples(
    path: str | Path, tokenizer: Any, max_length: int, limit: int | None = None, opts: LoadOptions | None = None,
) -> tuple[list[TokenizedSample], DataStats]:
    """Read and tokenize a chat data path, stopping after `limit` conversations; with
    opts.concat_to, consecutive ones joined into longer rows (data/concat.py)."""
    opts = opts or LoadOptions()
    if max_length < 1:
        raise DataError(f"max_length must be positive, got {max_length}")
    if not 0 <= opts.concat_to <= max_length:
        raise DataError(f"data.concat_to={opts.concat_to}: must be between 0 (off) and data.max_length={max_length}")
    samples, stats = _conversations(path, tokenizer, max_length, limit, opts)
    if opts.concat_to:
        stats.joined, samples = len(samples), concatenate(samples, opts.concat_to)
        stats.samples = len(samples)
    return samples, stats


def _conversations(path, tokenizer, max_length: int, limit: int | None, opts: LoadOptions):
    """One sample per conversation, from the tokenization cache when it is on."""
    if not opts.cache:
        return _tokenize(path, tokenizer, max_length, limit, opts)
    from filelock import FileLock

    from splitserve.assets import cache_dir

    root = cache_dir() / "tokenized"
    root.mkdir(parents=True, exist_ok=True)
    entry = root / cache_key(path, tokenizer, max_length, limit, opts)
    with FileLock(str(entry) + ".lock"):
        if entry.exists():
            return _load(entry)
        samples, stats = _tokenize(path, tokenizer, max_length, limit, opts)
        _save(entry, samples, stats)
        return samples, stats
