"""Tests for splitserve.data: JSONL validation, assistant-only masks, prompts, chitchat."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from splitserve.data import (
    DataError,
    chitchat_paths,
    encode_prompt,
    load_samples,
    read_conversations,
    read_prompts,
    resolve_prompts_path,
    resolve_train_path,
    tokenize_conversation,
)
from splitserve.data.chitchat import is_heldout

REPO = Path(__file__).resolve().parents[1]
END = "<|im_end|>"
GEN_HEADER = "<|im_start|>assistant\n"


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def masked_text(tokenizer, sample) -> str:
    return tokenizer.decode([t for t, m in zip(sample.input_ids, sample.loss_mask) if m])


def unmasked_text(tokenizer, sample) -> str:
    return tokenizer.decode([t for t, m in zip(sample.input_ids, sample.loss_mask) if not m])


# --------------------------------------------------------------------------- reading


def test_malformed_json_names_file_and_line(tmp_path):
    rows = [{"prompt": "a", "response": "b"}, "", "{not json"]
    path = write_jsonl(tmp_path / "broken.jsonl", rows)
    with pytest.raises(DataError) as err:
        list(read_conversations(path))
    assert "broken.jsonl:3" in str(err.value)


@pytest.mark.parametrize(
    "row, complaint",
    [
        ({"messages": [{"role": "robot", "content": "beep"}]}, "unknown role"),
        ([1, 2], "object"),
        ({"messages": [{"role": "user"}]}, "content"),
        ({"messages": [{"role": "user", "content": 3}]}, "string"),
        ({"messages": "hi"}, "list"),
        ({"prompt": "only a prompt"}, "response"),
        ({"prompt": "p", "response": None}, "string"),
    ],
)
def test_bad_rows_raise_data_error(tmp_path, row, complaint):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"messages": [user("ok"), assistant("ok")]}, row])
    with pytest.raises(DataError, match=complaint) as err:
        list(read_conversations(path))
    assert "bad.jsonl:2" in str(err.value)


def test_prompt_response_rows(tmp_path, smollm2_tokenizer):
    path = write_jsonl(
        tmp_path / "pr.jsonl",
        [{"prompt": "Q1", "response": "A1"}, {"system": "S", "prompt": "Q2", "response": "A2"}],
    )
    convs = list(read_conversations(path))
    assert convs == [
        (1, [user("Q1"), assistant("A1")]),
        (2, [{"role": "system", "content": "S"}, user("Q2"), assistant("A2")]),
    ]
    samples, stats = load_samples(path, smollm2_tokenizer, max_length=256)
    assert stats.samples == 2
    assert [masked_text(smollm2_tokenizer, s) for s in samples] == ["A1" + END, "A2" + END]
    assert samples[1].source == f"{path}:2"


# --------------------------------------------------------------------------- masks


def test_assistant_mask_covers_exactly_assistant_contents(smollm2_tokenizer):
    tok = smollm2_tokenizer
    messages = [
        {"role": "system", "content": "You are a very terse assistant."},
        user("What colour is grass?"),
        assistant("Green, mostly."),
        user("And the sky?"),
        assistant("Blue on a clear day.\nGrey when it rains."),
    ]
    sample = tokenize_conversation(tok, messages, max_length=512)
    assert sample is not None and not sample.truncated
    assert len(sample.loss_mask) == len(sample.input_ids)
    expected = "Green, mostly." + END + "Blue on a clear day.\nGrey when it rains." + END
    assert masked_text(tok, sample) == expected
    context = unmasked_text(tok, sample)
    for text in ("terse", "What colour is grass?", "And the sky?", "<|im_start|>assistant"):
        assert text in context
    # Every end-of-turn token is trained only when it closes an assistant message.
    end_id = tok.convert_tokens_to_ids(END)
    trained_ends = sum(m for t, m in zip(sample.input_ids, sample.loss_mask) if t == end_id)
    assert trained_ends == 2 < sample.input_ids.count(end_id)
    # The newline the template appends after <|im_end|> is not trained.
    last_trained = max(i for i, m in enumerate(sample.loss_mask) if m)
    assert sample.input_ids[last_trained] == end_id
    assert sample.input_ids[last_trained + 1 :] and not any(sample.loss_mask[last_trained + 1 :])


def test_loss_on_all_trains_every_token_after_the_first(smollm2_tokenizer):
    """data.loss_on=all: the same ids as the assistant-only mask, every token but the first
    trained (users' turns and the template's tokens too); a conversation without a reply, which
    the assistant-only mask skips, is trainable."""
    tok = smollm2_tokenizer
    messages = [user("What colour is grass?"), assistant("Green, mostly.")]
    replies = tokenize_conversation(tok, messages, max_length=512)
    whole = tokenize_conversation(tok, messages, max_length=512, loss_on="all")
    assert whole.input_ids == replies.input_ids
    assert whole.loss_mask == [0] + [1] * (len(whole.input_ids) - 1)
    assert "What colour is grass?" in masked_text(tok, whole)
    only_user = [user("hello?"), user("anyone?")]
    assert tokenize_conversation(tok, only_user, max_length=512) is None
    assert sum(tokenize_conversation(tok, only_user, max_length=512, loss_on="all").loss_mask) > 3
    cut = tokenize_conversation(tok, messages, max_length=6, loss_on="all")
    assert cut.truncated and len(cut.input_ids) == 6
    with pytest.raises(ValueError, match="loss_on"):
        tokenize_conversation(tok, messages, max_length=512, loss_on="users")


def test_conversation_opening_with_assistant(smollm2_tokenizer):
    messages = [assistant("Welcome! Ask me anything."), user("hi"), assistant("Hello.")]
    sample = tokenize_conversation(smollm2_tokenizer, messages, max_length=512)
    expected = "Welcome! Ask me anything." + END + "Hello." + END
    assert masked_text(smollm2_tokenizer, sample) == expected


def test_fallback_format_without_chat_template(smollm2_tokenizer):
    tok = copy.deepcopy(smollm2_tokenizer)
    tok.chat_template = None
    sample = tokenize_conversation(tok, [user("hi"), assistant("hello there")], max_length=64)
    assert masked_text(tok, sample) == " hello there" + tok.eos_token
    assert "User: hi" in unmasked_text(tok, sample)
    assert tok.decode(encode_prompt(tok, [user("hi")])).endswith("User: hi\nAssistant:")


def test_template_that_is_not_prefix_stable_is_rejected(smollm2_tokenizer):
    tok = copy.deepcopy(smollm2_tokenizer)
    # Leading message count: a prefix of the conversation renders a different first line.
    tok.chat_template = (
        "{{ messages|length }}\n"
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    with pytest.raises(DataError, match="chat template"):
        tokenize_conversation(tok, [user("a"), assistant("b"), user("c")], max_length=64)


# --------------------------------------------------------------------------- loading


def test_empty_conversations_are_skipped_and_counted(tmp_path, smollm2_tokenizer):
    path = write_jsonl(
        tmp_path / "empty.jsonl",
        [
            {"messages": []},
            {"messages": [user("anyone?"), assistant("  "), user("hello?"), assistant("")]},
            {"messages": [user("only a question")]},
            {"messages": [user("hi"), assistant("hey")]},
        ],
    )
    samples, stats = load_samples(path, smollm2_tokenizer, max_length=256)
    assert (stats.rows, stats.samples, stats.skipped_empty) == (4, 1, 3)
    assert stats.tokens == len(samples[0].input_ids)
    assert stats.loss_tokens == sum(samples[0].loss_mask) == 2  # "hey" + <|im_end|>
    assert "4 rows read, 1 used; skipped: 3 with no assistant reply to learn from;" in stats.summary()


def test_long_sequences_are_truncated(tmp_path, smollm2_tokenizer):
    long_reply = " ".join(["word"] * 300)
    path = write_jsonl(
        tmp_path / "long.jsonl",
        [
            {"prompt": "Say 'word' many times.", "response": long_reply},
            {"prompt": "short", "response": "fine"},
            # The only assistant turn starts past max_length: nothing left to train.
            {"prompt": " ".join(["question"] * 300), "response": "answer"},
        ],
    )
    samples, stats = load_samples(path, smollm2_tokenizer, max_length=48)
    assert len(samples[0].input_ids) == len(samples[0].loss_mask) == 48
    assert samples[0].truncated and not samples[1].truncated
    assert (stats.samples, stats.truncated, stats.skipped_empty) == (2, 1, 1)
    assert masked_text(smollm2_tokenizer, samples[0]).startswith("word word")


def test_limit_stops_early(tmp_path, smollm2_tokenizer):
    rows = [{"prompt": f"q{i}", "response": f"a{i}"} for i in range(10)]
    path = write_jsonl(tmp_path / "many.jsonl", rows)
    samples, stats = load_samples(path, smollm2_tokenizer, max_length=64, limit=3)
    assert len(samples) == stats.samples == 3


def test_shipped_samples_load(smollm2_tokenizer):
    path = REPO / "data" / "sample_chat.jsonl"
    samples, stats = load_samples(path, smollm2_tokenizer, max_length=512)
    assert len(samples) == stats.samples == stats.rows == 5 and stats.skipped_empty == 0
    prompts = read_prompts(REPO / "data" / "sample_prompts.jsonl")
    assert len(prompts) == 5
    assert all(isinstance(p, str) or p[-1]["role"] == "user" for p in prompts)


# --------------------------------------------------------------------------- prompts


def test_read_prompts_drops_reference_answer(tmp_path):
    path = write_jsonl(
        tmp_path / "prompts.jsonl",
        [
            {"messages": [user("q"), assistant("reference")]},
            {"prompt": "plain text"},
            {"messages": [user("q1"), assistant("a1"), user("q2")]},
        ],
    )
    assert read_prompts(path) == [
        [user("q")],
        "plain text",
        [user("q1"), assistant("a1"), user("q2")],
    ]


def test_read_prompts_errors_name_the_line(tmp_path):
    rows = [{"prompt": "ok"}, {"messages": [assistant("no question")]}]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(DataError, match=r"p\.jsonl:2"):
        read_prompts(path)
    path = write_jsonl(tmp_path / "q.jsonl", [{"text": "?"}])
    with pytest.raises(DataError, match=r"q\.jsonl:1"):
        read_prompts(path)


def test_encode_prompt_ends_with_generation_header(smollm2_tokenizer):
    tok = smollm2_tokenizer
    for prompt in ("Tell me a joke.", [user("Tell me a joke.")]):
        text = tok.decode(encode_prompt(tok, prompt))
        assert text.endswith("<|im_start|>user\nTell me a joke." + END + "\n" + GEN_HEADER)
    # Same tokens as the training render of the conversation up to the reply.
    sample = tokenize_conversation(tok, [user("Tell me a joke."), assistant("No.")], max_length=128)
    ids = encode_prompt(tok, [user("Tell me a joke.")])
    assert sample.input_ids[: len(ids)] == ids and sample.loss_mask[len(ids)] == 1
    assert not any(sample.loss_mask[: len(ids)])


# --------------------------------------------------------------------------- resolving + chitchat


def test_resolve_paths(tmp_path):
    existing = write_jsonl(tmp_path / "mine.jsonl", [{"prompt": "a", "response": "b"}])
    assert resolve_train_path(str(existing)) == str(existing)
    assert resolve_prompts_path(str(existing)) == str(existing)
    with pytest.raises(DataError, match="chitchat"):
        resolve_train_path(str(tmp_path / "missing.jsonl"))
    with pytest.raises(DataError, match="missing.jsonl"):
        resolve_prompts_path(str(tmp_path / "missing.jsonl"))


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _alternates(messages: list[dict]) -> bool:
    roles = [m["role"] for m in messages]
    return roles[0] == "user" and all(a != b for a, b in zip(roles, roles[1:]))


def test_chitchat_conversion(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPLITSERVE_CACHE", str(tmp_path))
    paths = chitchat_paths()
    assert "converted chitchat-dataset" in capsys.readouterr().out
    assert paths.train.parent == tmp_path / "data" / "chitchat"
    train, heldout, prompts = _read(paths.train), _read(paths.heldout), _read(paths.heldout_prompts)
    total = len(train) + len(heldout)
    assert total > 7000
    assert 0.01 < len(heldout) / total < 0.03
    assert all(is_heldout(row["id"]) for row in heldout)
    assert not any(is_heldout(row["id"]) for row in train)
    assert len({row["id"] for row in train + heldout}) == total
    for row in train + heldout + prompts:
        assert _alternates(row["messages"])
        assert all(m["content"].strip() for m in row["messages"])
    heldout_by_id = {row["id"]: row["messages"] for row in heldout}
    assert prompts
    for row in prompts:
        full = heldout_by_id[row["id"]]
        n = len(row["messages"])
        assert row["messages"][-1]["role"] == "user"
        assert row["messages"] == full[:n] and full[n]["role"] == "assistant"
        assert n <= 5  # at most the third user turn
    # Second use: nothing is converted again and the name resolves to the same files.
    assert chitchat_paths() == paths
    assert capsys.readouterr().out == ""
    assert resolve_train_path("chitchat") == str(paths.train)
    assert resolve_prompts_path("chitchat") == str(paths.heldout_prompts)
    assert not list(paths.train.parent.glob("*.tmp"))
