"""Pre-tokenized training rows: token ids the user already has, trained without a chat template.

    {"input_ids": [int, ...]}                             every token after the first is trained
    {"input_ids": [int, ...], "loss_mask": [0|1, ...]}    the tokens marked 1 are trained

This is the shape speculators' and SpecForge's preprocessing writes, and the one a workload that is
not chat needs: raw continuations of text (base models), or the target's own greedy continuations
of benchmark prompts made of token ids (`sglang.bench_serving --dataset-name random`), where a
decode-and-re-encode round trip would not give the ids the target saw back. The ids are used as
they are: no template, no special tokens added. Position 0 is never trained (nothing predicts it),
so its mask bit is ignored; `data.loss_on=all` trains every token after the first whatever the mask.

A row that breaks the shape (ids not a list of non-negative ints, a mask of another length or with
values other than 0/1) is malformed; ids past the tokenizer's vocabulary make a row malformed when
it is tokenized, naming the id, since those rows were made for another target.
"""

from __future__ import annotations

from typing import Any

from splitserve.data.chat import Message, TokenizedSample, after_first, cut_sample
from splitserve.data.formats import parse_messages
from splitserve.data.rows import DataError

KEY = "input_ids"  # a row with this field is pre-tokenized


def parse_training_row(row: dict, where: str) -> dict[str, list[int]] | list[Message]:
    """Any training row -> its parsed form: {"input_ids", "loss_mask"} for a pre-tokenized row, a
    message list for a chat row (formats.parse_messages). A fault is a DataError naming the row."""
    return parse_tokenized(row, where) if row.get(KEY) is not None else parse_messages(row, where)


def _int_list(value: Any, where: str, key: str) -> list[int]:
    if hasattr(value, "tolist"):  # a columnar format's array
        value = value.tolist()
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise DataError(f"{where}: '{key}' must be a list of integers")
    return value


def parse_tokenized(row: dict, where: str) -> dict[str, list[int]]:
    """A pre-tokenized row -> {"input_ids", "loss_mask"} (the mask: the row's, or every token after
    the first), validated; a fault is a DataError naming the row."""
    ids = _int_list(row[KEY], where, KEY)
    if not ids:
        raise DataError(f"{where}: '{KEY}' is empty")
    if min(ids) < 0:
        raise DataError(f"{where}: '{KEY}' holds a negative id ({min(ids)})")
    if row.get("loss_mask") is None:
        return {KEY: ids, "loss_mask": after_first(len(ids))}
    mask = _int_list(row["loss_mask"], where, "loss_mask")
    if len(mask) != len(ids):
        raise DataError(f"{where}: 'loss_mask' has {len(mask)} entries for {len(ids)} input_ids")
    if any(m not in (0, 1) for m in mask):
        raise DataError(f"{where}: 'loss_mask' must hold only 0 and 1")
    return {KEY: ids, "loss_mask": [0] + mask[1:]}


def tokenized_sample(row: dict[str, list[int]], vocab_size: int, max_length: int, loss_on: str,
                     source: str) -> TokenizedSample | None:
    """A parsed row -> a sample cut to max_length, as chat.tokenize_conversation gives; None when
    nothing is left to train. Raises DataError for an id the tokenizer does not have."""
    ids = row[KEY]
    if max(ids) >= vocab_size:
        raise DataError(f"{source}: token id {max(ids)} is outside the tokenizer's {vocab_size} ids "
                        f"(rows tokenized for another model?)")
    mask = after_first(len(ids)) if loss_on == "all" else row["loss_mask"]
    return cut_sample(ids, mask, max_length, source)
