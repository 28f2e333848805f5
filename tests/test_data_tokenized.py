"""Pre-tokenized training rows ({"input_ids", "loss_mask"}): used as given, without a template;
mixed with chat rows; cut and counted at max_length; bad rows skipped and named; Parquet rows alike;
and a short training run on them."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

import splitserve.train.loop as loop
from splitserve.checks import check_train_data
from splitserve.config import DataConfig, EvalConfig, RunConfig
from splitserve.data import DataError, LoadOptions, load_samples
from splitserve.target.hf import load_hf_target
from tests.tiny import tiny_smol_run

CHAT = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."}]}


def _write(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_ids_and_mask_are_used_as_given_beside_chat_rows(tmp_path, smollm2_tokenizer):
    ids = [5, 17, 900, 42, 42, 7]
    path = _write(tmp_path / "d.jsonl", [{"input_ids": ids, "loss_mask": [1, 0, 0, 1, 1, 1]},
                                         CHAT, {"input_ids": ids}])
    got, stats = load_samples(path, smollm2_tokenizer, 64)
    chat, _ = load_samples(_write(tmp_path / "c.jsonl", [CHAT]), smollm2_tokenizer, 64)
    assert stats.samples == 3 and not stats.skipped
    # position 0 is never trained: nothing before it predicts it
    assert (got[0].input_ids, got[0].loss_mask) == (ids, [0, 0, 0, 1, 1, 1])
    assert (got[1].input_ids, got[1].loss_mask) == (chat[0].input_ids, chat[0].loss_mask)
    assert (got[2].input_ids, got[2].loss_mask) == (ids, [0, 1, 1, 1, 1, 1])
    assert stats.loss_tokens == 3 + sum(chat[0].loss_mask) + 5
    every, _ = load_samples(path, smollm2_tokenizer, 64, opts=LoadOptions(loss_on="all"))
    assert every[0].loss_mask == [0, 1, 1, 1, 1, 1]


def test_long_rows_are_cut_or_skipped_and_a_row_with_nothing_left_is_empty(tmp_path, smollm2_tokenizer):
    long = {"input_ids": list(range(100, 140))}
    late = {"input_ids": list(range(100, 140)), "loss_mask": [0] * 30 + [1] * 10}  # trained only past 30
    path = _write(tmp_path / "d.jsonl", [long, late])
    cut, stats = load_samples(path, smollm2_tokenizer, 16)
    assert [len(s.input_ids) for s in cut] == [16] and cut[0].truncated and stats.truncated == 1
    assert stats.skipped["empty"] == [f"{path}:2"]
    kept, stats = load_samples(path, smollm2_tokenizer, 16, opts=LoadOptions(overlong="skip"))
    assert kept == [] and stats.skipped["long"] == [f"{path}:1"]


@pytest.mark.parametrize("row, complaint", [
    ({"input_ids": [1, "2"]}, "'input_ids' must be a list of integers"),
    ({"input_ids": [1, True]}, "'input_ids' must be a list of integers"),
    ({"input_ids": []}, "'input_ids' is empty"),
    ({"input_ids": [3, -1]}, r"'input_ids' holds a negative id \(-1\)"),
    ({"input_ids": [3, 4], "loss_mask": [1]}, "'loss_mask' has 1 entries for 2 input_ids"),
    ({"input_ids": [3, 4], "loss_mask": [0, 2]}, "'loss_mask' must hold only 0 and 1"),
    ({"input_ids": [3, 10**6]}, r"token id 1000000 is outside the tokenizer's 49152 ids \(rows tokenized for another model"),
])
def test_a_bad_row_is_skipped_and_named_or_stops_a_strict_run(tmp_path, smollm2_tokenizer, row, complaint):
    path = _write(tmp_path / "d.jsonl", [{"input_ids": [1, 2, 3]}, row])
    got, stats = load_samples(path, smollm2_tokenizer, 64)
    assert len(got) == 1 and stats.skipped["malformed"] == [f"{path}:2"]
    with pytest.raises(DataError, match=rf"d\.jsonl:2: {complaint}"):
        load_samples(path, smollm2_tokenizer, 64, opts=LoadOptions(strict=True))


def test_the_check_before_a_run_reads_the_shape(tmp_path):
    def check(path, strict=False):
        check_train_data(RunConfig(data=DataConfig(train_path=str(path), strict=strict), eval=EvalConfig(enabled=False)))

    check(_write(tmp_path / "ok.jsonl", [{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}]), strict=True)
    bad = _write(tmp_path / "bad.jsonl", [{"input_ids": [1, 2, 3], "loss_mask": [0, 1]}])
    with pytest.raises(DataError, match=r"bad\.jsonl: no usable row among 1 .*'loss_mask' has 2 entries for 3"):
        check(bad)


def test_parquet_rows_train(tiny_smol_dir, tmp_path, monkeypatch):
    """Token-id rows stored as Parquet (as speculators' and SpecForge's preprocessing keep them) give
    the same samples as JSON lines, and a run trains on them."""
    monkeypatch.setenv("SPLITSERVE_CACHE", str(tmp_path / "cache"))
    rows = [{"input_ids": [1 + (7 * i + j) % 90 for j in range(24)], "loss_mask": [0] * 8 + [1] * 16}
            for i in range(4)]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "ids.parquet"))
    cfg = tiny_smol_run(tiny_smol_dir, tmp_path / "ids.parquet", tmp_path / "run")
    target = load_hf_target(cfg.target)
    samples = loop.build_source(cfg, target).samples
    assert [(s.input_ids, s.loss_mask) for s in samples] == [(r["input_ids"], r["loss_mask"]) for r in rows]
    assert loop.train(cfg, target).state.step == 2


def test_row_with_both_input_ids_and_messages_is_read_from_its_ids():
    """docs/data.md: a preprocessed row that kept its source text trains on its exact ids."""
    from splitserve.data.tokenized import parse_training_row

    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
           "input_ids": [5, 6, 7], "loss_mask": [0, 0, 1]}
    assert parse_training_row(row, "f.jsonl:1") == {"input_ids": [5, 6, 7], "loss_mask": [0, 0, 1]}
    assert isinstance(parse_training_row({"messages": row["messages"], "input_ids": None}, "f.jsonl:2"), list)
