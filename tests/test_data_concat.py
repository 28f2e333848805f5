"""data.concat_to: consecutive conversations joined into long rows of real text, for long-context
training; nothing padded, nothing dropped, every row within the limit."""

from __future__ import annotations

import json

import pytest

from splitserve.data import DataError, LoadOptions, load_samples


def _conversations(path, n: int):
    rows = [{"messages": [{"role": "user", "content": f"Question {i}: " + "why " * (i % 7)},
                          {"role": "assistant", "content": f"Answer {i}. " + "because " * (3 + i % 5)}]}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("per_row", [3, 10])
def test_joined_rows_are_the_conversations_in_order(tmp_path, smollm2_tokenizer, per_row):
    path = _conversations(tmp_path / "chat.jsonl", 20)
    single, one_stats = load_samples(path, smollm2_tokenizer, 1024)
    concat_to = per_row * max(len(s.input_ids) for s in single)
    joined, stats = load_samples(path, smollm2_tokenizer, 1024, opts=LoadOptions(concat_to=concat_to))
    assert [t for s in joined for t in s.input_ids] == [t for s in single for t in s.input_ids]
    assert [m for s in joined for m in s.loss_mask] == [m for s in single for m in s.loss_mask]
    assert all(len(s.input_ids) <= concat_to for s in joined)
    # Rows end on conversation boundaries, and greedily: no row could have taken the next one too.
    start = 0
    for row in joined:
        n, used = 0, 0
        while used < len(row.input_ids):
            used += len(single[start + n].input_ids)
            n += 1
        assert used == len(row.input_ids)
        expected = single[start].source if n == 1 else f"{single[start].source} .. {single[start + n - 1].source}"
        assert row.source == expected
        if start + n < len(single):
            assert used + len(single[start + n].input_ids) > concat_to
        start += n
    assert start == len(single) and 1 < len(joined) < len(single)
    assert (stats.samples, stats.joined, stats.tokens) == (len(joined), len(single), one_stats.tokens)
    assert f"20 rows read, 20 used; none skipped; 0 cut to data.max_length; joined into {len(joined)} rows" \
        in stats.summary()


def test_a_conversation_longer_than_the_limit_keeps_its_own_row(tmp_path, smollm2_tokenizer):
    path = _conversations(tmp_path / "chat.jsonl", 6)
    single, _ = load_samples(path, smollm2_tokenizer, 256)
    limit = max(len(s.input_ids) for s in single) - 1
    joined, _ = load_samples(path, smollm2_tokenizer, 256, opts=LoadOptions(concat_to=limit))
    longest = max(single, key=lambda s: len(s.input_ids))
    assert any(r.input_ids == longest.input_ids and r.source == longest.source for r in joined)


def test_a_limit_past_max_length_is_refused(tmp_path, smollm2_tokenizer):
    path = _conversations(tmp_path / "chat.jsonl", 3)
    with pytest.raises(DataError, match=r"data.concat_to=300: must be between 0 \(off\) and data.max_length=256"):
        load_samples(path, smollm2_tokenizer, 256, opts=LoadOptions(concat_to=300))
