"""Loading training samples: bad rows skipped and counted with where they were (strict: an error),
tokenization cached and reused, worker processes giving the same samples, and a training run on
ShareGPT rows stored as Parquet."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

import splitserve.data.samples as samples_mod
import splitserve.train.loop as loop
from splitserve.checks import check_train_data
from splitserve.config import DataConfig, EvalConfig, RunConfig
from splitserve.data import DataError, LoadOptions, load_samples
from splitserve.target.hf import load_hf_target
from tests.tiny import tiny_smol_run

GOOD = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."}]}


def _write(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_malformed_rows_among_good_ones_are_skipped_with_their_lines(tmp_path, smollm2_tokenizer, capsys):
    path = _write(tmp_path / "mixed.jsonl", [GOOD, "{not json", GOOD, {"messages": [{"role": "robot", "content": "x"}]},
                                             {"prompt": "p", "response": "r"}])
    samples, stats = load_samples(path, smollm2_tokenizer, 64)
    assert [s.source for s in samples] == [f"{path}:1", f"{path}:3", f"{path}:5"]
    assert stats.rows == 5 and stats.samples == 3
    assert stats.skipped["malformed"] == [f"{path}:2", f"{path}:4"]
    assert f"5 rows read, 3 used; skipped: 2 malformed at {path}:2, {path}:4;" in stats.summary()
    assert f"{path}:2: malformed JSON" in capsys.readouterr().out
    with pytest.raises(DataError, match=r"mixed\.jsonl:2: malformed JSON"):
        load_samples(path, smollm2_tokenizer, 64, opts=LoadOptions(strict=True))


def test_rows_longer_than_max_length_are_cut_or_skipped_and_counted(tmp_path, smollm2_tokenizer):
    long = {"messages": [{"role": "user", "content": "Tell me."}, {"role": "assistant", "content": "Sure. " * 30}]}
    path = _write(tmp_path / "long.jsonl", [GOOD, long, GOOD])
    cut, stats = load_samples(path, smollm2_tokenizer, 48)
    assert len(cut) == 3 and stats.truncated == 1 and max(len(s.input_ids) for s in cut) == 48
    assert "1 cut to data.max_length" in stats.summary()
    kept, stats = load_samples(path, smollm2_tokenizer, 48, opts=LoadOptions(overlong="skip"))
    assert [s.source for s in kept] == [f"{path}:1", f"{path}:3"] and stats.truncated == 0
    assert stats.skipped["long"] == [f"{path}:2"]
    assert "skipped: 1 longer than data.max_length (data.overlong=skip)" in stats.summary()
    with pytest.raises(DataError, match="data.overlong must be one of truncate, skip, got 'drop'"):
        LoadOptions(overlong="drop")


def test_columnar_bad_row_is_named_by_row_number(tmp_path, smollm2_tokenizer):
    path = tmp_path / "bad.parquet"
    rows = [{"prompt": "a", "response": "b"}, {"prompt": "c", "response": None}]
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    _, stats = load_samples(path, smollm2_tokenizer, 64)
    assert stats.skipped["malformed"] == [f"{path}: row 2"]
    with pytest.raises(DataError, match=r"bad\.parquet: row 2: 'response' must be a string"):
        load_samples(path, smollm2_tokenizer, 64, opts=LoadOptions(strict=True))


def test_empty_file_is_an_error_not_zero_samples(tmp_path, smollm2_tokenizer):
    (tmp_path / "none.jsonl").write_text("")
    with pytest.raises(DataError, match=r"none\.jsonl: empty \(no rows\)"):
        load_samples(tmp_path / "none.jsonl", smollm2_tokenizer, 64)


def test_second_load_reads_the_cache_and_edits_invalidate_it(tmp_path, smollm2_tokenizer, monkeypatch):
    monkeypatch.setenv("SPLITSERVE_CACHE", str(tmp_path / "cache"))
    path = _write(tmp_path / "d.jsonl", [GOOD, {"prompt": "Two plus two?", "response": "Four."}, "oops"])
    opts = LoadOptions(cache=True)
    first, stats1 = load_samples(path, smollm2_tokenizer, 64, opts=opts)
    assert not stats1.cached and len(list((tmp_path / "cache" / "tokenized").iterdir())) == 2  # entry + lock

    def no_tokenizing(*a, **k):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(samples_mod, "_tokenize_row", no_tokenizing)
    again, stats2 = load_samples(path, smollm2_tokenizer, 64, opts=opts)
    assert stats2.cached and [(s.input_ids, s.loss_mask, s.source) for s in again] == \
        [(s.input_ids, s.loss_mask, s.source) for s in first]
    assert stats2.skipped == stats1.skipped and stats2.summary().endswith("from cache")
    # Another max_length, or changed data, is another entry.
    with pytest.raises(AssertionError, match="tokenized again"):
        load_samples(path, smollm2_tokenizer, 32, opts=opts)
    with pytest.raises(AssertionError, match="tokenized again"):  # another loss mask too
        load_samples(path, smollm2_tokenizer, 64, opts=LoadOptions(cache=True, loss_on="all"))
    _write(path, [GOOD])
    with pytest.raises(AssertionError, match="tokenized again"):
        load_samples(path, smollm2_tokenizer, 64, opts=opts)


def test_loss_on_all_keeps_rows_without_a_reply_and_counts_their_tokens(tmp_path, smollm2_tokenizer):
    only_user = {"messages": [{"role": "user", "content": "Is anyone there?"}]}
    path = _write(tmp_path / "d.jsonl", [GOOD, only_user])
    replies, stats = load_samples(path, smollm2_tokenizer, 64)
    assert len(replies) == 1 and stats.skipped["empty"] == [f"{path}:2"]
    whole, stats = load_samples(path, smollm2_tokenizer, 64, opts=LoadOptions(loss_on="all"))
    assert len(whole) == 2 and stats.loss_tokens == sum(len(s.input_ids) - 1 for s in whole)
    with pytest.raises(DataError, match="data.loss_on must be one of assistant, all, got 'user'"):
        LoadOptions(loss_on="user")


def test_worker_processes_give_the_same_samples(tmp_path, smollm2_tokenizer):
    rows = [{"prompt": f"Question {i}?", "response": f"Answer number {i}."} for i in range(12)]
    path = _write(tmp_path / "many.jsonl", rows)
    one, _ = load_samples(path, smollm2_tokenizer, 64)
    two, stats = load_samples(path, smollm2_tokenizer, 64, opts=LoadOptions(num_proc=2))
    assert stats.samples == 12
    assert [(s.input_ids, s.loss_mask, s.source) for s in one] == [(s.input_ids, s.loss_mask, s.source) for s in two]


def test_train_on_sharegpt_parquet(tiny_smol_dir, tmp_path, monkeypatch):
    """ShareGPT rows (a tool turn among them) stored as Parquet train, with the masks the same
    conversations give as OpenAI messages in JSONL."""
    monkeypatch.setenv("SPLITSERVE_CACHE", str(tmp_path / "cache"))
    convs = [
        [("system", "You are terse."), ("human", "Weather in Paris?"), ("gpt", "Checking."),
         ("tool", "18C, sunny"), ("gpt", "Sunny, 18C."), ("human", "Thanks"), ("gpt", "Any time.")],
        [("human", "Name a colour."), ("gpt", "Blue.")],
        [("human", "Count to three."), ("gpt", "One, two, three.")],
    ]
    role = {"system": "system", "human": "user", "gpt": "assistant", "tool": "tool"}
    sharegpt = [{"conversations": [{"from": f, "value": v} for f, v in c]} for c in convs]
    openai = [{"messages": [{"role": role[f], "content": v} for f, v in c]} for c in convs]
    datasets.Dataset.from_list(sharegpt).to_parquet(str(tmp_path / "chat.parquet"))
    _write(tmp_path / "chat.jsonl", openai)
    cfg = tiny_smol_run(tiny_smol_dir, tmp_path / "chat.parquet", tmp_path / "run")
    target = load_hf_target(cfg.target)
    from_parquet = loop.build_source(cfg, target).samples
    want, _ = load_samples(tmp_path / "chat.jsonl", target.tokenizer, 96)
    assert [(s.input_ids, s.loss_mask) for s in from_parquet] == [(s.input_ids, s.loss_mask) for s in want]
    trained = target.tokenizer.decode([t for t, m in zip(from_parquet[0].input_ids, from_parquet[0].loss_mask) if m])
    assert trained == "Checking.<|im_end|>Sunny, 18C.<|im_end|>Any time.<|im_end|>"
    assert loop.train(cfg, target).state.step == 2


def test_concurrent_loaders_tokenize_once(tmp_path, smollm2_tokenizer, monkeypatch):
    """The target ranks of a split job all load at once: the first tokenizes, the others wait on
    the cache entry's lock and read what it wrote."""
    import threading

    monkeypatch.setenv("SPLITSERVE_CACHE", str(tmp_path / "cache"))
    path = _write(tmp_path / "d.jsonl", [GOOD] * 8)
    calls, real = [], samples_mod._tokenize
    monkeypatch.setattr(samples_mod, "_tokenize", lambda *a: calls.append(1) or real(*a))
    results = [None] * 3

    def load(k):
        results[k] = load_samples(path, smollm2_tokenizer, 64, opts=LoadOptions(cache=True))

    threads = [threading.Thread(target=load, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert sorted(r[1].cached for r in results) == [False, True, True]
    assert len({tuple(map(tuple, (s.input_ids for s in r[0]))) for r in results}) == 1


# --------------------------------------------------------------------------- the check before a train run


def _check(path: Path, strict: bool = False) -> None:
    check_train_data(RunConfig(data=DataConfig(train_path=str(path), strict=strict), eval=EvalConfig(enabled=False)))


IMAGE = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is it?"},
                                                   {"type": "image_url", "image_url": {"url": "x.png"}}]},
                      {"role": "assistant", "content": "A cat."}]}


def test_train_check_lets_bad_rows_through_to_be_counted(tmp_path, smollm2_tokenizer):
    """Without data.strict a bad row is the loader's to skip and count, not a reason to stop."""
    path = _write(tmp_path / "d.jsonl", [GOOD, '{"messages": [1, 2', "[1, 2]", IMAGE, GOOD])
    _check(path)
    samples, stats = load_samples(path, smollm2_tokenizer, 64)
    assert [s.source for s in samples] == [f"{path}:1", f"{path}:5"]
    assert stats.skipped["malformed"] == [f"{path}:2", f"{path}:3", f"{path}:4"]
    assert f"3 malformed at {path}:2, {path}:3, {path}:4;" in stats.summary()
    with pytest.raises(DataError, match=r"d\.jsonl:2: malformed JSON \(Expecting"):
        _check(path, strict=True)
    for line, complaint in [("[1, 2]", r"d\.jsonl:2: expected a JSON object, got list"),
                            (IMAGE, r"d\.jsonl:2: messages\[0\] content\[1\] has type 'image_url': non-text")]:
        _write(path, [GOOD, line])
        _check(path)
        with pytest.raises(DataError, match=complaint) as err:
            _check(path, strict=True)
        assert "\n" not in str(err.value)


def test_train_check_fails_when_no_row_is_usable(tmp_path):
    path = _write(tmp_path / "junk.jsonl", ["{not json", "[1, 2]", {"text": "no shape"}])
    with pytest.raises(DataError, match=r"junk\.jsonl: no usable row among 3 \(every row is malformed; the first: "
                                        r".*junk\.jsonl:1: malformed JSON") as err:
        _check(path)
    assert "\n" not in str(err.value)


def test_train_check_still_stops_at_a_bad_byte(tmp_path):
    """A line that is not UTF-8 means the file's encoding is wrong: an error with or without strict."""
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n" + '{"prompt": "caf\u00e9", "response": "x"}'.encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1\.jsonl:2: not UTF-8 text"):
        _check(path)


def test_bom_and_text_parts_give_the_plain_samples(tmp_path, smollm2_tokenizer):
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": "Hello there."}]}]}
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (json.dumps(parts) + "\n" + json.dumps(GOOD) + "\n").encode())
    _check(path, strict=True)
    got, stats = load_samples(path, smollm2_tokenizer, 64, opts=LoadOptions(strict=True))
    want, _ = load_samples(_write(tmp_path / "plain.jsonl", [GOOD, GOOD]), smollm2_tokenizer, 64)
    assert stats.samples == 2 and not stats.skipped
    assert [(s.input_ids, s.loss_mask) for s in got] == [(s.input_ids, s.loss_mask) for s in want]


def test_train_cli_skips_a_malformed_line(tiny_smol_dir, tmp_path, monkeypatch, capsys):
    """End to end through `splitserve train`: the run goes on and its data summary counts the rows."""
    from splitserve import cli

    monkeypatch.setenv("SPLITSERVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path / "d.jsonl", [GOOD, '{"messages": [1, 2', "[1, 2]", GOOD])
    cli.main(["train", f"target.path={tiny_smol_dir}", "target.name=tiny-smol", "target.layer_ids=[0,1,2]",
              f"data.train_path={path}", "eval.enabled=false", "draft.num_layers=1", "draft.intermediate_size=32",
              "draft.markov_rank=4", "draft.block_size=4", "train.max_steps=1", "train.batch_size=2",
              "train.anchors_per_seq=4", "train.device=cpu", f"run_dir={tmp_path / 'run'}"])
    out = capsys.readouterr().out
    assert f"4 rows read, 2 used; skipped: 2 malformed at {path}:2, {path}:3;" in out
    assert (tmp_path / "run" / "checkpoints" / "latest").exists()
