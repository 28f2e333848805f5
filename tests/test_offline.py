"""Offline dump: round trips, manifest bookkeeping, and refusal of broken or foreign dumps."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from splitserve.records import SCHEMA_VERSION, HiddenRecord, TargetInfo
from splitserve.stream import DumpError, DumpReader, DumpWriter

D = 16
TARGET = TargetInfo(name="tiny", vocab_size=100, hidden_size=D, num_layers=6, layer_ids=(1, 3, 4))
M = len(TARGET.layer_ids)
LENGTHS = [5, 9, 3, 12, 7, 4, 8]  # sum 48; with shard_tokens=12 -> several shards
SHARD_TOKENS = 12


def make_records(lengths: list[int] = LENGTHS, first_id: int = 100) -> list[HiddenRecord]:
    g = torch.Generator().manual_seed(0)
    records = []
    for k, t in enumerate(lengths):
        records.append(
            HiddenRecord(
                sample_id=first_id + k,
                input_ids=torch.randint(0, TARGET.vocab_size, (t,), generator=g),
                loss_mask=torch.rand(t, generator=g) < 0.5,
                aux=torch.randn(t, M * D, generator=g),
                final=torch.randn(t, D, generator=g),
            )
        )
    return records


def write_dump(path: Path, records: list[HiddenRecord], dtype: torch.dtype = torch.float32) -> None:
    with DumpWriter(path, TARGET, dtype, shard_tokens=SHARD_TOKENS) as w:
        for r in records:
            w.add(r)


def assert_same(got: HiddenRecord, want: HiddenRecord, dtype: torch.dtype) -> None:
    # bit-equal: the dump holds bytes, and both sides' bf16 casts are correctly rounded (RNE)
    assert got.sample_id == want.sample_id
    assert got.input_ids.dtype == torch.int64 and torch.equal(got.input_ids, want.input_ids)
    assert got.loss_mask.dtype == torch.bool and torch.equal(got.loss_mask, want.loss_mask)
    assert got.aux.dtype == dtype and torch.equal(got.aux, want.aux.to(dtype))
    assert got.final.dtype == dtype and torch.equal(got.final, want.final.to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip(tmp_path: Path, dtype: torch.dtype) -> None:
    records = make_records()
    write_dump(tmp_path, records, dtype)
    reader = DumpReader(tmp_path)
    assert len(reader) == len(records)
    assert reader.target == TARGET
    for got, want in zip(reader, records, strict=True):
        assert_same(got, want, dtype)
    # Random access, across shards and backwards, must agree with sequential reads.
    for i in [6, 0, 3, -1]:
        assert_same(reader[i], records[i], dtype)
    with pytest.raises(IndexError):
        reader[len(records)]


def test_manifest_fields(tmp_path: Path) -> None:
    records = make_records()
    write_dump(tmp_path, records, torch.bfloat16)
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["schema_version"] == SCHEMA_VERSION
    assert m["format"] == "splitserve-hidden-dump"
    assert m["target"] == {
        "name": "tiny",
        "vocab_size": 100,
        "hidden_size": D,
        "num_layers": 6,
        "layer_ids": [1, 3, 4],
    }
    assert m["layer_ids"] == [1, 3, 4]
    assert m["dtype"] == "bfloat16"
    assert (m["aux_dim"], m["hidden_size"]) == (M * D, D)
    assert m["num_samples"] == len(records)
    assert m["num_tokens"] == sum(LENGTHS)
    assert m["num_loss_tokens"] == sum(int(r.loss_mask.sum()) for r in records)
    assert m["created_by"].startswith("splitserve ")
    # Flush happens once the buffer reaches 12 tokens: [5, 9] [3, 12] [7, 4, 8] -> three shards.
    shards = m["shards"]
    assert [s["file"] for s in shards] == [f"shard_{i:05d}.safetensors" for i in range(3)]
    assert [s["num_samples"] for s in shards] == [2, 2, 3]
    assert [s["num_tokens"] for s in shards] == [14, 15, 19]
    for s in shards:
        assert s["bytes"] == (tmp_path / s["file"]).stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"] + [s["file"] for s in shards]


def test_truncated_shard(tmp_path: Path) -> None:
    write_dump(tmp_path, make_records())
    shard = tmp_path / "shard_00001.safetensors"
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size - 10)
    reader = DumpReader(tmp_path)
    reader[0]  # shard 0 is intact and still readable
    with pytest.raises(DumpError, match=r"shard_00001\.safetensors.*truncated or corrupt.*found") as err:
        reader[2]
    assert f"expected {size} bytes, found {size - 10}" in str(err.value)


def test_missing_shard(tmp_path: Path) -> None:
    write_dump(tmp_path, make_records())
    (tmp_path / "shard_00002.safetensors").unlink()
    with pytest.raises(DumpError, match=r"shard_00002\.safetensors"):
        list(DumpReader(tmp_path))


def test_corrupt_header_same_size(tmp_path: Path) -> None:
    write_dump(tmp_path, make_records())
    shard = tmp_path / "shard_00000.safetensors"
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.seek(8)  # past the 8-byte header length: the JSON header itself
        f.write(b"\xff" * 16)
    assert shard.stat().st_size == size
    reader = DumpReader(tmp_path)
    with pytest.raises(DumpError, match=r"shard_00000\.safetensors"):
        reader[0]


def test_check_target(tmp_path: Path) -> None:
    write_dump(tmp_path, make_records())
    reader = DumpReader(tmp_path)
    reader.check_target(TARGET)
    reader.check_target(replace(TARGET, layer_ids=[1, 3, 4]))  # a list is the same layers
    with pytest.raises(DumpError, match="layer_ids") as err:
        reader.check_target(replace(TARGET, layer_ids=(1, 3, 5)))
    assert "vocab_size" not in str(err.value)
    with pytest.raises(DumpError) as err:
        reader.check_target(replace(TARGET, name="other", vocab_size=101, num_layers=7))
    for field in ("name", "vocab_size", "num_layers"):
        assert field in str(err.value)
    assert "hidden_size" not in str(err.value)


def test_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(DumpError, match="not a finished dump"):
        DumpReader(tmp_path)


def test_wrong_format_or_schema(tmp_path: Path) -> None:
    write_dump(tmp_path, make_records())
    path = tmp_path / "manifest.json"
    m = json.loads(path.read_text())
    path.write_text(json.dumps({**m, "schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(DumpError, match=rf"schema_version {SCHEMA_VERSION + 1}.*{SCHEMA_VERSION}"):
        DumpReader(tmp_path)
    path.write_text(json.dumps({**m, "format": "something-else"}))
    with pytest.raises(DumpError, match="something-else.*splitserve-hidden-dump"):
        DumpReader(tmp_path)


def test_writer_refuses_existing_dump(tmp_path: Path) -> None:
    write_dump(tmp_path, make_records())
    with pytest.raises(FileExistsError, match="overwrite"):
        DumpWriter(tmp_path, TARGET, torch.float32)
    # overwrite replaces the old dump entirely: no stale shards survive.
    with DumpWriter(tmp_path, TARGET, torch.float32, overwrite=True) as w:
        w.add(make_records([4], first_id=7)[0])
    reader = DumpReader(tmp_path)
    assert len(reader) == 1 and reader[0].sample_id == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "shard_00000.safetensors"]


def test_writer_rejects_bad_widths(tmp_path: Path) -> None:
    r = make_records([4])[0]
    with DumpWriter(tmp_path, TARGET, torch.float32) as w:
        with pytest.raises(ValueError, match="sample 100.*aux"):
            w.add(replace(r, aux=torch.zeros(4, (M - 1) * D)))
        with pytest.raises(ValueError, match="sample 100.*final"):
            w.add(replace(r, final=torch.zeros(4, D + 1)))
        w.add(r)
        with pytest.raises(ValueError, match="sample 100.*already"):
            w.add(r)


def test_resume_keeps_complete_shards(tmp_path: Path) -> None:
    records = make_records()

    class Crash(Exception):
        pass

    # Crash with sample 104 still buffered: shards 0 and 1 are on disk, and the writer saves
    # the buffered record as shard 2 on the way out, but writes no manifest.
    with pytest.raises(Crash):
        with DumpWriter(tmp_path, TARGET, torch.bfloat16, shard_tokens=SHARD_TOKENS) as w:
            for r in records[:5]:
                w.add(r)
            raise Crash
    assert not (tmp_path / "manifest.json").exists()
    assert (tmp_path / "shard_00002.safetensors").exists()
    # What a harder crash can leave too: a half-written temp file and a damaged shard.
    (tmp_path / "shard_00003.safetensors.tmp").write_bytes(b"partial")
    (tmp_path / "shard_00003.safetensors").write_bytes(b"\x00" * 40)
    (tmp_path / "shard_00007.safetensors").write_bytes(b"\x00" * 40)  # beyond the gap: dropped
    with pytest.raises(DumpError, match="not a finished dump"):
        DumpReader(tmp_path)
    with pytest.raises(FileExistsError, match="resume=True"):
        DumpWriter(tmp_path, TARGET, torch.bfloat16)

    with DumpWriter(tmp_path, TARGET, torch.bfloat16, shard_tokens=SHARD_TOKENS, resume=True) as w:
        assert w.done_sample_ids == {r.sample_id for r in records[:5]}
        for r in records:
            if r.sample_id not in w.done_sample_ids:
                w.add(r)
    reader = DumpReader(tmp_path)
    assert [r.sample_id for r in reader] == [r.sample_id for r in records]
    for got, want in zip(reader, records, strict=True):
        assert_same(got, want, torch.bfloat16)
    assert reader.manifest["num_loss_tokens"] == sum(int(r.loss_mask.sum()) for r in records)
    assert reader.manifest["num_tokens"] == sum(LENGTHS)
    assert [s["num_samples"] for s in reader.manifest["shards"]] == [2, 2, 1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"] + [
        f"shard_{i:05d}.safetensors" for i in range(4)
    ]


def test_resume_refuses_other_target(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with DumpWriter(tmp_path, TARGET, torch.float32, shard_tokens=4) as w:
            w.add(make_records([5])[0])
            raise RuntimeError("crash")
    other = replace(TARGET, layer_ids=(0, 2, 5))
    with pytest.raises(ValueError, match="cannot resume"):
        DumpWriter(tmp_path, other, torch.float32, resume=True)
