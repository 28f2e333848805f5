"""Write `HiddenRecord`s to a dump directory: token-bounded safetensors shards + a manifest.

Every file lands under its final name by an atomic rename, so a crash leaves only complete
shards behind; the manifest is written last and is what marks the dump as finished. An
interrupted dump (shards, no manifest) can be continued with `resume=True`.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import safetensors.torch
import torch

from splitserve.records import SCHEMA_VERSION, HiddenRecord, TargetInfo
from splitserve.stream.dump_reader import (
    FORMAT,
    MANIFEST_NAME,
    SHARD_GLOB,
    DumpError,
    dtype_name,
    read_shard,
    shard_name,
)


def _created_by() -> str:
    try:
        return f"splitserve {importlib.metadata.version('splitserve')}"
    except importlib.metadata.PackageNotFoundError:
        return "splitserve dev"


def _atomic_replace(tmp: Path, final: Path) -> None:
    """Make tmp durable, then give it its final name in one step."""
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)


@dataclass
class _ShardEntry:
    file: str
    num_samples: int
    num_tokens: int
    num_loss_tokens: int
    bytes: int

    def manifest_entry(self) -> dict[str, Any]:
        # Loss tokens are only kept per shard to total them; the manifest lists the rest.
        return {
            "file": self.file,
            "num_samples": self.num_samples,
            "num_tokens": self.num_tokens,
            "bytes": self.bytes,
        }


class DumpWriter:
    """Buffer records and write them as shards of about `shard_tokens` tokens each.

    A shard is flushed once the buffered token count reaches shard_tokens, so a shard can run
    over by up to one sample; a sample is never split across shards.
    """

    def __init__(
        self,
        out_dir: str | Path,
        target: TargetInfo,
        dtype: torch.dtype,
        shard_tokens: int = 65536,
        *,
        overwrite: bool = False,
        resume: bool = False,
    ) -> None:
        if shard_tokens <= 0:
            raise ValueError(f"shard_tokens must be positive, got {shard_tokens}")
        if not dtype.is_floating_point:
            raise ValueError(f"hidden states are stored as a floating dtype, got {dtype}")
        if overwrite and resume:
            raise ValueError("overwrite=True and resume=True contradict each other")
        self.out_dir = Path(out_dir)
        self.target = target
        self.dtype = dtype
        self.shard_tokens = shard_tokens
        self.hidden_size = target.hidden_size
        self.aux_dim = len(target.layer_ids) * target.hidden_size

        self._shards: list[_ShardEntry] = []
        self._buffer: list[HiddenRecord] = []
        self._buffered_tokens = 0
        self._closed = False
        # Every id written so far; ids from resumed shards are also exposed to the caller.
        self._written_ids: set[int] = set()
        self.done_sample_ids: set[int] = set()

        self.out_dir.mkdir(parents=True, exist_ok=True)
        if (self.out_dir / MANIFEST_NAME).exists() and not overwrite:
            raise FileExistsError(
                f"{self.out_dir} already holds a finished dump; pass overwrite=True to replace it"
            )
        if overwrite:
            self._remove_dump_files()
        elif resume:
            self._resume()
        elif any(self.out_dir.glob(SHARD_GLOB)):
            raise FileExistsError(
                f"{self.out_dir} holds shards of an interrupted dump; pass resume=True to continue "
                "it or overwrite=True to start over"
            )

    # ---- public API -------------------------------------------------------------------------

    def add(self, record: HiddenRecord) -> None:
        """Buffer one record; may write a shard. The record's tensors are not kept."""
        if self._closed:
            raise RuntimeError("DumpWriter is closed")
        self._validate(record)
        self._written_ids.add(record.sample_id)
        # Copy to CPU in storage form now: the buffer then frees accelerator memory, costs the
        # stored size rather than the caller's, and is immune to the caller reusing its tensors.
        self._buffer.append(
            HiddenRecord(
                sample_id=record.sample_id,
                input_ids=record.input_ids.detach().to("cpu", torch.int64, copy=True),
                loss_mask=record.loss_mask.detach().to("cpu", torch.bool, copy=True),
                aux=record.aux.detach().to("cpu", self.dtype, copy=True),
                final=record.final.detach().to("cpu", self.dtype, copy=True),
            )
        )
        self._buffered_tokens += record.num_tokens
        if self._buffered_tokens >= self.shard_tokens:
            self._flush()

    def close(self) -> None:
        """Write the remaining records and the manifest. Safe to call twice."""
        if self._closed:
            return
        self._flush()
        self._write_manifest()
        self._closed = True

    @property
    def num_samples(self) -> int:
        return sum(s.num_samples for s in self._shards) + len(self._buffer)

    def __enter__(self) -> DumpWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
            return
        # A failed run must not look finished: no manifest. The buffered records are complete,
        # though, so save them as a shard that a resumed run can skip.
        if not self._closed:
            self._closed = True
            try:
                self._flush()
            except Exception:
                pass  # the original error is the one worth seeing

    # ---- internals --------------------------------------------------------------------------

    def _validate(self, record: HiddenRecord) -> None:
        sid = record.sample_id
        if sid in self._written_ids:
            raise ValueError(f"sample {sid} was already written to this dump")
        if record.input_ids.ndim != 1:
            raise ValueError(f"sample {sid}: input_ids must be (T,), got {tuple(record.input_ids.shape)}")
        if record.aux.ndim != 2 or record.aux.shape[1] != self.aux_dim:
            raise ValueError(
                f"sample {sid}: aux is {tuple(record.aux.shape)}, expected (T, {self.aux_dim}) "
                f"= {len(self.target.layer_ids)} layers x hidden size {self.hidden_size}"
            )
        if record.final.ndim != 2 or record.final.shape[1] != self.hidden_size:
            raise ValueError(
                f"sample {sid}: final is {tuple(record.final.shape)}, expected (T, {self.hidden_size})"
            )

    def _flush(self) -> None:
        """Write the buffered records as the next shard (nothing when the buffer is empty)."""
        if not self._buffer:
            return
        records, self._buffer, self._buffered_tokens = self._buffer, [], 0
        lengths = torch.tensor([0] + [r.num_tokens for r in records], dtype=torch.int64)
        # Buffered records are already CPU tensors in storage dtypes (see add), except the mask:
        # safetensors' bool is not portable to every reader, so it is stored as uint8.
        tensors = {
            "input_ids": torch.cat([r.input_ids for r in records]),
            "loss_mask": torch.cat([r.loss_mask for r in records]).to(torch.uint8),
            "aux": torch.cat([r.aux for r in records]),
            "final": torch.cat([r.final for r in records]),
            "offsets": torch.cumsum(lengths, 0),
            "sample_ids": torch.tensor([r.sample_id for r in records], dtype=torch.int64),
        }
        name = shard_name(len(self._shards))
        path = self.out_dir / name
        tmp = path.with_name(name + ".tmp")
        safetensors.torch.save_file(tensors, str(tmp), metadata=self._shard_metadata())
        _atomic_replace(tmp, path)
        self._shards.append(
            _ShardEntry(
                file=name,
                num_samples=len(records),
                num_tokens=int(tensors["input_ids"].shape[0]),
                num_loss_tokens=int(tensors["loss_mask"].sum()),
                bytes=path.stat().st_size,
            )
        )

    def _target_dict(self) -> dict[str, Any]:
        target = asdict(self.target)
        target["layer_ids"] = list(self.target.layer_ids)
        return target

    def _shard_metadata(self) -> dict[str, str]:
        # The manifest is the reader's source of truth; this copy lets a resume check that
        # the shards it keeps were made for the same target and schema.
        return {
            "format": FORMAT,
            "schema_version": str(SCHEMA_VERSION),
            "target": json.dumps(self._target_dict(), sort_keys=True),
        }

    def _write_manifest(self) -> None:
        target = self._target_dict()
        manifest = {
            "schema_version": SCHEMA_VERSION,
            "format": FORMAT,
            "target": target,
            "layer_ids": list(self.target.layer_ids),
            "dtype": dtype_name(self.dtype),
            "aux_dim": self.aux_dim,
            "hidden_size": self.hidden_size,
            "num_samples": sum(s.num_samples for s in self._shards),
            "num_tokens": sum(s.num_tokens for s in self._shards),
            "num_loss_tokens": sum(s.num_loss_tokens for s in self._shards),
            "shards": [s.manifest_entry() for s in self._shards],
            "created_by": _created_by(),
        }
        path = self.out_dir / MANIFEST_NAME
        tmp = path.with_name(MANIFEST_NAME + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")
        _atomic_replace(tmp, path)

    def _remove_dump_files(self) -> None:
        # The manifest goes first, so a crash mid-cleanup never leaves it describing new shards.
        (self.out_dir / MANIFEST_NAME).unlink(missing_ok=True)
        for path in self.out_dir.glob(SHARD_GLOB):
            path.unlink()
        self._remove_temp_files()

    def _remove_temp_files(self) -> None:
        """Temp files are writes a crash cut short; only our own names, never a user's file."""
        for path in self.out_dir.glob(SHARD_GLOB + ".tmp"):
            path.unlink()
        (self.out_dir / (MANIFEST_NAME + ".tmp")).unlink(missing_ok=True)

    def _resume(self) -> None:
        """Keep the unbroken run shard_00000, shard_00001, ... of shards that load; drop the rest.

        Keeping only a prefix keeps shard numbering dense; samples of a dropped shard are simply
        not in done_sample_ids, so the caller writes them again.
        """
        kept: set[str] = set()
        while True:
            name = shard_name(len(self._shards))
            path = self.out_dir / name
            if not path.is_file():
                break
            try:
                shard = read_shard(path, states=False)
            except DumpError:
                break
            if shard.metadata != self._shard_metadata():
                raise ValueError(
                    f"cannot resume into {self.out_dir}: {name} was written for {shard.metadata}, "
                    f"this writer is {self._shard_metadata()}"
                )
            widths = (shard.aux_dim, shard.hidden_size, shard.dtype)
            if widths != (self.aux_dim, self.hidden_size, self.dtype):
                raise ValueError(
                    f"cannot resume into {self.out_dir}: {name} stores aux width {shard.aux_dim}, "
                    f"hidden size {shard.hidden_size}, {dtype_name(shard.dtype)}; this writer has "
                    f"{self.aux_dim}, {self.hidden_size}, {dtype_name(self.dtype)}"
                )
            self._shards.append(
                _ShardEntry(
                    file=name,
                    num_samples=shard.num_samples,
                    num_tokens=shard.num_tokens,
                    num_loss_tokens=int(shard.loss_mask.sum()),
                    bytes=path.stat().st_size,
                )
            )
            self.done_sample_ids.update(int(x) for x in shard.sample_ids.tolist())
            kept.add(name)
        for path in self.out_dir.glob(SHARD_GLOB):
            if path.name not in kept:
                path.unlink()
        self._remove_temp_files()
        self._written_ids |= self.done_sample_ids
