"""Training data stored as Parquet, Arrow or a save_to_disk directory reads as the same rows
as JSONL; bad bytes and bad files are one-line errors naming the file and row."""

import json

import datasets
import pytest

from splitserve.data import DataError, read_conversations, read_prompts, resolve_train_path
from splitserve.data.rows import iter_rows

ROWS = [
    {"messages": [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."}]},
    {"prompt": "Two plus two?", "response": "Four."},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."},
                  {"role": "assistant", "content": "Blue."}]},
]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def stored(tmp_path):
    """The same conversations as JSONL and in each columnar form (one schema: messages only)."""
    rows = [r if "messages" in r else {"messages": [{"role": "user", "content": r["prompt"]},
                                                   {"role": "assistant", "content": r["response"]}]}
            for r in ROWS]
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "chat.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "saved_dict"))
    arrow = next((tmp_path / "saved").glob("*.arrow"))
    return _jsonl(tmp_path / "chat.jsonl", rows), [tmp_path / "chat.parquet", arrow, tmp_path / "saved",
                                                   tmp_path / "saved_dict"]


def test_columnar_forms_read_as_the_jsonl_rows(stored):
    jsonl, others = stored
    want = list(read_conversations(jsonl))
    assert len(want) == 3 and want[2][1][0]["role"] == "system"
    for path in others:
        assert resolve_train_path(str(path)) == str(path)
        assert list(read_conversations(path)) == want, path
        assert len(read_prompts(path)) == 3


def test_columnar_row_errors_name_the_row(tmp_path):
    path = tmp_path / "bad.parquet"
    datasets.Dataset.from_list([{"messages": [{"role": "user", "content": "ok"}]},
                                {"messages": [{"role": "robot", "content": "beep"}]}]).to_parquet(str(path))
    with pytest.raises(DataError, match=r"bad\.parquet: row 2: messages\[0\] has unknown role 'robot'"):
        list(read_conversations(path))


def test_dataset_dict_without_train_split_is_refused(tmp_path):
    datasets.DatasetDict({"test": datasets.Dataset.from_list(ROWS[:1])}).save_to_disk(str(tmp_path / "d"))
    with pytest.raises(DataError, match=r"without a 'train' split \(has \['test'\]\)"):
        list(iter_rows(tmp_path / "d"))


def test_unreadable_columnar_file_is_one_line(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(DataError, match=r"broken\.parquet: cannot be read as a dataset"):
        list(iter_rows(path))


def test_non_utf8_line_is_named(tmp_path):
    path = tmp_path / "latin1.jsonl"
    good = json.dumps(ROWS[0]).encode()
    path.write_bytes(good + b"\n" + '{"prompt": "caf\u00e9", "response": "x"}'.encode("latin-1") + b"\n")
    rows = iter_rows(path)
    assert next(rows)[0] == 1  # the good line still reads
    with pytest.raises(DataError, match=r"latin1\.jsonl:2: not UTF-8 text \(byte 0xe9 at column 16\)"):
        next(rows)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(DataError, match=r"nope\.jsonl: no such file"):
        list(iter_rows(tmp_path / "nope.jsonl"))
    with pytest.raises(DataError, match="neither 'chitchat'"):
        resolve_train_path(str(tmp_path / "nope.parquet"))
