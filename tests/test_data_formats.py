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


# --------------------------------------------------------------------------- row shapes and paths


def _msgs(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


SHAPES = [
    ({"conversations": [{"from": "system", "value": "Be kind."}, {"from": "human", "value": "Hi"},
                        {"from": "gpt", "value": "Hello."}, {"from": "tool", "value": "42"},
                        {"from": "gpt", "value": "It is 42."}]},
     _msgs(("system", "Be kind."), ("user", "Hi"), ("assistant", "Hello."), ("tool", "42"),
           ("assistant", "It is 42."))),
    ({"instruction": "Translate.", "input": "chat", "output": "cat"},
     _msgs(("user", "Translate.\n\nchat"), ("assistant", "cat"))),
    ({"instruction": "Say hi.", "input": "", "output": "hi", "system": "S"},
     _msgs(("system", "S"), ("user", "Say hi."), ("assistant", "hi"))),
    ({"messages": [{"role": "user", "content": "weather?"},
                   {"role": "assistant", "content": None, "tool_calls": [{"name": "get_weather"}]},
                   {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
                   {"role": "assistant", "content": "Sunny.", "reasoning_content": "look it up"}]},
     [{"role": "user", "content": "weather?"},
      {"role": "assistant", "content": "", "tool_calls": [{"name": "get_weather"}]},
      {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
      {"role": "assistant", "content": "Sunny.", "reasoning_content": "look it up"}]),
]


@pytest.mark.parametrize("row, want", SHAPES)
def test_row_shapes_map_to_messages(tmp_path, row, want):
    assert list(read_conversations(_jsonl(tmp_path / "r.jsonl", [row]))) == [(1, want)]


def test_sharegpt_unknown_speaker_and_unknown_shape_name_the_row(tmp_path):
    path = _jsonl(tmp_path / "s.jsonl", [SHAPES[0][0], {"conversations": [{"from": "robot", "value": "beep"}]}])
    with pytest.raises(DataError, match=r"s\.jsonl:2: conversations\[0\] has unknown speaker 'robot'"):
        list(read_conversations(path))
    with pytest.raises(DataError, match=r"t\.jsonl:1: unknown row format .*got keys \['text'\]"):
        list(read_conversations(_jsonl(tmp_path / "t.jsonl", [{"text": "hello"}])))


def test_json_array_and_globs_read_every_row(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(ROWS[:2], indent=2))
    _jsonl(tmp_path / "b.jsonl", ROWS[2:])
    assert [n for n, _ in read_conversations(tmp_path / "a.json")] == [1, 2]
    both = list(read_conversations(str(tmp_path / "*.json*")))
    assert [m[-1]["content"] for _, m in both] == ["Hello.", "Four.", "Blue."]
    assert resolve_train_path(str(tmp_path / "*.json*")) == str(tmp_path / "*.json*")
    with pytest.raises(DataError, match="neither 'chitchat'"):
        resolve_train_path(str(tmp_path / "*.parquet"))
    with pytest.raises(DataError, match=r"\*\.csv: the pattern matches no file"):
        list(iter_rows(str(tmp_path / "*.csv")))


@pytest.mark.parametrize("name, content, complaint", [
    ("empty.jsonl", "", r"empty\.jsonl: empty \(no rows\)"),
    ("blank.jsonl", "\n\n", r"blank\.jsonl: empty \(no rows\)"),
    ("data.csv", "a,b\n", r"data\.csv: unknown data format '\.csv'"),
    ("obj.json", "[1, 2", r"obj\.json: malformed JSON array"),
])
def test_file_level_faults_are_one_line_errors(tmp_path, name, content, complaint):
    (tmp_path / name).write_text(content)
    with pytest.raises(DataError, match=complaint) as err:
        list(iter_rows(tmp_path / name))
    assert "\n" not in str(err.value)


def test_unreadable_file_is_one_line(tmp_path):
    path = tmp_path / "dir.jsonl"
    path.mkdir()
    with pytest.raises(DataError, match=r"dir\.jsonl") as err:
        list(iter_rows(path))
    assert "\n" not in str(err.value)


# --------------------------------------------------------------------------- byte order mark


BOM = b"\xef\xbb\xbf"


def test_bom_jsonl_reads_its_first_row(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(BOM + "".join(json.dumps(r) + "\n" for r in ROWS).encode())
    assert list(read_conversations(path)) == list(read_conversations(_jsonl(tmp_path / "plain.jsonl", ROWS)))
    assert [n for n, _, _ in iter_rows(path)] == [1, 2, 3]


@pytest.mark.parametrize("lead", [b"", b"\n  "])
def test_bom_json_array_is_read_as_an_array(tmp_path, lead):
    path = tmp_path / "bom.json"
    path.write_bytes(BOM + lead + json.dumps(ROWS, indent=2).encode())
    assert [where for _, _, where in iter_rows(path)] == [f"{path}: row {i}" for i in (1, 2, 3)]
    assert len(read_prompts(path)) == 3


def test_bom_only_at_the_start_and_bad_bytes_still_named(tmp_path):
    path = tmp_path / "bom2.jsonl"
    path.write_bytes(BOM + json.dumps(ROWS[0]).encode() + b"\n" + BOM + json.dumps(ROWS[1]).encode() + b"\n")
    with pytest.raises(DataError, match=r"bom2\.jsonl:2: malformed JSON"):
        list(iter_rows(path))
    path.write_bytes(BOM + b'{"prompt": "caf\xe9", "response": "x"}\n')
    with pytest.raises(DataError, match=r"bom2\.jsonl:1: not UTF-8 text \(byte 0xe9 at column 16\)"):
        list(iter_rows(path))


# --------------------------------------------------------------------------- content parts


def _parts(*texts):
    return [{"type": "text", "text": t} for t in texts]


def test_text_content_parts_are_joined(tmp_path):
    row = {"messages": [{"role": "system", "content": _parts("Be brief.")},
                        {"role": "user", "content": _parts("hi", "there")},
                        {"role": "assistant", "content": _parts("Hello", "!")}]}
    # one newline between parts, as vLLM joins them for a string-content chat template
    want = _msgs(("system", "Be brief."), ("user", "hi\nthere"), ("assistant", "Hello\n!"))
    assert list(read_conversations(_jsonl(tmp_path / "p.jsonl", [row]))) == [(1, want)]
    # Columnar: Arrow stores the parts as structs (an absent key is None).
    datasets.Dataset.from_list([row]).to_parquet(str(tmp_path / "p.parquet"))
    assert list(read_conversations(tmp_path / "p.parquet")) == [(1, want)]


@pytest.mark.parametrize("part, complaint", [
    ({"type": "image_url", "image_url": {"url": "http://x/cat.png"}},
     r"content\[1\] has type 'image_url': non-text parts are not supported"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
     r"content\[1\] has type 'input_audio': non-text parts are not supported"),
    ({"text": "no type"}, r"content\[1\] has type None: non-text parts are not supported"),
    ("bare string", r"content\[1\] must be a content part object, got str"),
    ({"type": "text", "text": 3}, r"content\[1\] 'text' must be a string, got int"),
])
def test_non_text_content_parts_name_the_row(tmp_path, part, complaint):
    row = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]},
                        {"role": "assistant", "content": "A cat."}]}
    path = _jsonl(tmp_path / "img.jsonl", [ROWS[0], row])
    with pytest.raises(DataError, match=r"img\.jsonl:2: messages\[0\] " + complaint) as err:
        list(read_conversations(path))
    assert "\n" not in str(err.value)


def test_sharegpt_value_stays_a_string(tmp_path):
    """Content parts are an OpenAI shape: a ShareGPT 'value' list is refused as before."""
    row = {"conversations": [{"from": "human", "value": _parts("hi")}, {"from": "gpt", "value": "Hello."}]}
    with pytest.raises(DataError, match=r"s\.jsonl:1: conversations\[0\] content must be a string, got list"):
        list(read_conversations(_jsonl(tmp_path / "s.jsonl", [row])))
    assert list(read_conversations(_jsonl(tmp_path / "ok.jsonl", [SHAPES[0][0]]))) == [(1, SHAPES[0][1])]


def test_gen_reads_bom_files_and_text_parts(tmp_path):
    from splitserve.data.gen_plan import read_sources

    row = {"messages": [{"role": "user", "content": _parts("hi", "there")}, {"role": "assistant", "content": "x"}]}
    path = tmp_path / "g.jsonl"
    path.write_bytes(BOM + (json.dumps(row) + "\n").encode())
    assert [s.turns for s in read_sources(path)] == [[[{"role": "user", "content": "hi\nthere"}]]]
    row["messages"][0]["content"].append({"type": "image_url", "image_url": {"url": "x.png"}})
    path.write_bytes(BOM + (json.dumps(row) + "\n").encode())
    with pytest.raises(DataError, match=r"g\.jsonl:1: messages\[0\] content\[2\] has type 'image_url': non-text"):
        read_sources(path)


class _Vocab:
    """A tokenizer stand-in with 100 ids: only its length matters to a token-id prompt."""

    def __len__(self):
        return 100


def test_token_id_prompts_are_used_as_they_are(tmp_path):
    from splitserve.data import encode_prompt
    from splitserve.data.prompts import TokenPrompt

    path = tmp_path / "p.jsonl"
    rows = [{"input_ids": [5, 6, 7]},                                   # a prompt as it is
            {"input_ids": [5, 6, 7, 8, 9], "loss_mask": [0, 0, 0, 1, 1]},  # a training row: cut before its reply
            {"input_ids": [5, 6], "loss_mask": [0, 0]},                  # nothing trained: the whole row
            {"input_ids": [5, 6, 99], "messages": [{"role": "user", "content": "hi"}]},  # ids win over text
            {"input_ids": [5, 100]}]                                     # an id the tokenizer lacks
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = read_prompts(path)
    assert all(isinstance(p, TokenPrompt) for p in prompts)
    got = [encode_prompt(_Vocab(), p) for p in prompts[:4]]
    assert got == [[5, 6, 7], [5, 6, 7], [5, 6], [5, 6, 99]]
    with pytest.raises(DataError, match=r"p\.jsonl:5: token id 100 is outside the tokenizer's 100 ids"):
        encode_prompt(_Vocab(), prompts[4])


def test_malformed_token_id_prompt_names_the_row(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"input_ids": [1, 2]}) + "\n" + json.dumps({"input_ids": [1, "x"]}) + "\n")
    with pytest.raises(DataError, match=r"p\.jsonl:2: 'input_ids' must be a list of integers"):
        read_prompts(path)
