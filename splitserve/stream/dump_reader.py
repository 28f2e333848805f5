"""Read a finished hidden-state dump back as `HiddenRecord`s, refusing anything suspect.

A dump is a directory of safetensors shards plus `manifest.json`; the manifest is written last,
so its presence is what marks a dump as finished. The shard layout (shared with the writer):

    input_ids  (N_tok,)      int64
    loss_mask  (N_tok,)      uint8
    aux        (N_tok, m*D)  stored dtype
    final      (N_tok, D)    stored dtype
    offsets    (n+1,)        int64, sample i is tokens offsets[i]:offsets[i+1]
    sample_ids (n,)          int64
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from splitserve.records import SCHEMA_VERSION, HiddenRecord, TargetInfo

FORMAT = "splitserve-hidden-dump"
MANIFEST_NAME = "manifest.json"
SHARD_GLOB = "shard_*.safetensors"
SHARD_KEYS = frozenset({"input_ids", "loss_mask", "aux", "final", "offsets", "sample_ids"})
# The hidden states dominate a shard's size; the rest is cheap to read even when only checking.
STATE_KEYS = ("aux", "final")


class DumpError(RuntimeError):
    """A dump directory is unfinished, corrupt, or does not belong to the expected target."""


def shard_name(index: int) -> str:
    return f"shard_{index:05d}.safetensors"


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16", the spelling kept in the manifest."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise DumpError(f"unknown dtype {name!r} in dump manifest")
    return dtype


@dataclass
class ShardContents:
    """One shard as loaded. aux/final are None when only the index part was read.

    Tensor shapes are the shard layout in the module docstring; aux_dim/hidden_size/dtype are
    read from the file header even when the states themselves were skipped.
    """

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    offsets: torch.Tensor
    sample_ids: torch.Tensor
    aux: torch.Tensor | None
    final: torch.Tensor | None
    aux_dim: int
    hidden_size: int
    dtype: torch.dtype
    metadata: dict[str, str]

    @property
    def num_samples(self) -> int:
        return int(self.sample_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


def read_shard(path: Path, states: bool = True) -> ShardContents:
    """Load one shard and check it is internally consistent; any failure is a DumpError.

    states=False skips reading aux/final (the bulk of the bytes) but still checks their shapes
    from the header, which is enough to tell a complete shard from a broken one.
    """
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            if keys != SHARD_KEYS:
                raise DumpError(f"shard {path} has tensors {sorted(keys)}, expected {sorted(SHARD_KEYS)}")
            small = {k: f.get_tensor(k) for k in SHARD_KEYS - set(STATE_KEYS)}
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in STATE_KEYS}
            big = {k: f.get_tensor(k) for k in STATE_KEYS} if states else {}
            # The header's dtype code ("BF16") is not torch's spelling; a tiny read gives it.
            dtype = f.get_slice("final")[:0].dtype
            metadata = dict(f.metadata() or {})
    except DumpError:
        raise
    except Exception as exc:  # safetensors raises several types for a bad header or buffer
        raise DumpError(f"shard {path} could not be loaded (corrupt header or data): {exc}") from exc

    ids, mask, offsets, sids = small["input_ids"], small["loss_mask"], small["offsets"], small["sample_ids"]
    n_tok = int(ids.shape[0]) if ids.ndim == 1 else -1
    n = int(sids.shape[0]) if sids.ndim == 1 else -1
    aux_shape, final_shape = shapes["aux"], shapes["final"]
    problems = []
    if ids.ndim != 1 or ids.dtype != torch.int64:
        problems.append(f"input_ids {tuple(ids.shape)} {ids.dtype}")
    if mask.shape != ids.shape or mask.dtype != torch.uint8:
        problems.append(f"loss_mask {tuple(mask.shape)} {mask.dtype}")
    if len(aux_shape) != 2 or aux_shape[0] != n_tok:
        problems.append(f"aux {aux_shape}")
    if len(final_shape) != 2 or final_shape[0] != n_tok:
        problems.append(f"final {final_shape}")
    if sids.ndim != 1 or sids.dtype != torch.int64:
        problems.append(f"sample_ids {tuple(sids.shape)} {sids.dtype}")
    if (
        offsets.shape != (n + 1,)
        or offsets.dtype != torch.int64
        or int(offsets[0]) != 0
        or int(offsets[-1]) != n_tok
        or bool((offsets[1:] < offsets[:-1]).any())
    ):
        problems.append(f"offsets {offsets.tolist() if offsets.numel() < 8 else tuple(offsets.shape)}")
    if problems:
        raise DumpError(f"shard {path} is inconsistent: " + "; ".join(problems))

    return ShardContents(
        input_ids=ids,
        loss_mask=mask,
        offsets=offsets,
        sample_ids=sids,
        aux=big.get("aux"),
        final=big.get("final"),
        aux_dim=int(aux_shape[1]),
        hidden_size=int(final_shape[1]),
        dtype=dtype,
        metadata=metadata,
    )


class DumpReader:
    """Random and sequential access to a finished dump's samples, in writing order."""

    def __init__(self, dump_dir: str | Path) -> None:
        self.dump_dir = Path(dump_dir)
        self.manifest: dict[str, Any] = self._read_manifest()
        m = self.manifest
        t = m["target"]
        self.target = TargetInfo(
            name=str(t["name"]),
            vocab_size=int(t["vocab_size"]),
            hidden_size=int(t["hidden_size"]),
            num_layers=int(t["num_layers"]),
            layer_ids=tuple(int(x) for x in t["layer_ids"]),
        )
        self.dtype: torch.dtype = dtype_from_name(m["dtype"])
        self.aux_dim = int(m["aux_dim"])
        self.hidden_size = int(m["hidden_size"])
        # index i -> (shard number, position inside that shard), so lookups never scan.
        self._index: list[tuple[int, int]] = [
            (s, j) for s, shard in enumerate(m["shards"]) for j in range(int(shard["num_samples"]))
        ]
        if len(self._index) != int(m["num_samples"]):
            raise DumpError(
                f"{self.manifest_path} is inconsistent: shards hold {len(self._index)} samples, "
                f"num_samples says {m['num_samples']}"
            )
        self._cached: tuple[int, ShardContents] | None = None

    @property
    def manifest_path(self) -> Path:
        return self.dump_dir / MANIFEST_NAME

    def _read_manifest(self) -> dict[str, Any]:
        path = self.manifest_path
        if not path.is_file():
            raise DumpError(
                f"{self.dump_dir} is not a finished dump: no {MANIFEST_NAME} "
                "(an interrupted dump can be continued with DumpWriter(..., resume=True))"
            )
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise DumpError(f"{path} is not readable JSON: {exc}") from exc
        if not isinstance(manifest, dict):
            raise DumpError(f"{path} is not a dump manifest (top level is not an object)")
        if manifest.get("format") != FORMAT:
            raise DumpError(f"{path} has format {manifest.get('format')!r}, expected {FORMAT!r}")
        if manifest.get("schema_version") != SCHEMA_VERSION:
            raise DumpError(
                f"{path} has schema_version {manifest.get('schema_version')!r}, "
                f"this splitserve reads schema_version {SCHEMA_VERSION}"
            )
        required = ("target", "dtype", "aux_dim", "hidden_size", "num_samples", "shards")
        missing = [k for k in required if k not in manifest]
        if missing:
            raise DumpError(f"{path} is missing fields {missing}")
        return manifest

    def check_target(self, info: TargetInfo) -> None:
        """Raise DumpError listing every identity field where the dump and `info` differ."""
        diffs = []
        for field in ("name", "vocab_size", "hidden_size", "num_layers", "layer_ids"):
            ours, theirs = getattr(self.target, field), getattr(info, field)
            if field == "layer_ids":
                theirs = tuple(theirs)
            if ours != theirs:
                diffs.append(f"{field}: dump has {ours!r}, expected {theirs!r}")
        if diffs:
            raise DumpError(f"dump {self.dump_dir} was made for another target: " + "; ".join(diffs))

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i: int) -> HiddenRecord:
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range for a dump of {len(self)}")
        s, j = self._index[i]
        shard = self._shard(s)
        a, b = int(shard.offsets[j]), int(shard.offsets[j + 1])
        assert shard.aux is not None and shard.final is not None
        # Copies, not views: a view would pin the whole cached shard for as long as the caller
        # keeps the record, and in-place edits by the caller would leak into later reads.
        return HiddenRecord(
            sample_id=int(shard.sample_ids[j]),
            input_ids=shard.input_ids[a:b].clone(),
            loss_mask=shard.loss_mask[a:b].bool(),
            aux=shard.aux[a:b].clone(),
            final=shard.final[a:b].clone(),
        )

    def __iter__(self) -> Iterator[HiddenRecord]:
        for i in range(len(self)):
            yield self[i]

    def _shard(self, s: int) -> ShardContents:
        if self._cached is not None and self._cached[0] == s:
            return self._cached[1]
        self._cached = None  # drop the previous shard before loading the next one
        contents = self._load_shard(s)
        self._cached = (s, contents)
        return contents

    def _load_shard(self, s: int) -> ShardContents:
        entry = self.manifest["shards"][s]
        path = self.dump_dir / entry["file"]
        expected = int(entry["bytes"])
        found = f"{path.stat().st_size} bytes" if path.is_file() else "no file"
        if found != f"{expected} bytes":
            raise DumpError(f"shard {path} is truncated or corrupt: expected {expected} bytes, found {found}")
        contents = read_shard(path)
        problems = []
        if contents.num_samples != int(entry["num_samples"]):
            problems.append(f"{contents.num_samples} samples, manifest says {entry['num_samples']}")
        if contents.num_tokens != int(entry["num_tokens"]):
            problems.append(f"{contents.num_tokens} tokens, manifest says {entry['num_tokens']}")
        if contents.aux_dim != self.aux_dim or contents.hidden_size != self.hidden_size:
            problems.append(
                f"widths aux={contents.aux_dim} final={contents.hidden_size}, "
                f"manifest says aux={self.aux_dim} final={self.hidden_size}"
            )
        if contents.dtype != self.dtype:
            problems.append(f"dtype {dtype_name(contents.dtype)}, manifest says {dtype_name(self.dtype)}")
        if problems:
            raise DumpError(f"shard {path} does not match the manifest: " + "; ".join(problems))
        return contents
