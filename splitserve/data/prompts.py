"""Evaluation prompts: read them from a data file and encode them exactly as training renders them.

Acceptance-rate measurements are only meaningful if the prompt ends where the target would
start generating, so a chat prompt always ends with a user turn followed by the generation header.
A pre-tokenized row (`{"input_ids": [...]}`, with an optional `loss_mask`) is a prompt of those
exact ids: the whole row, or the ids before its first trained token, where the reply begins.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from splitserve.data.chat import (
    DEFAULT,
    ChatTemplate,
    DataError,
    Message,
    has_chat_template,
    parse_messages,
    render_chat,
    specials_for,
)
from splitserve.data.rows import iter_rows
from splitserve.data.tokenized import KEY, parse_tokenized


@dataclass(frozen=True)
class TokenPrompt:
    """A prompt given as token ids, used as they are (no template, no special tokens)."""

    ids: tuple[int, ...]
    where: str  # file:row, for an error about an id the target's tokenizer does not have


Prompt = list[Message] | str | TokenPrompt


def _token_prompt(row: dict, where: str) -> TokenPrompt:
    parsed = parse_tokenized(row, where)
    ids = parsed[KEY]
    if row.get("loss_mask") is not None and 1 in parsed["loss_mask"]:
        ids = ids[: parsed["loss_mask"].index(1)]  # a training row: the prompt ends where its reply starts
    return TokenPrompt(tuple(ids), where)


def read_prompts(path: str | Path) -> list[Prompt]:
    """Read prompt rows (any training row shape, or `{"prompt": str}`); a final assistant turn is dropped."""
    prompts: list[Prompt] = []
    for _lineno, row, where in iter_rows(path):
        if row.get(KEY) is not None:
            prompts.append(_token_prompt(row, where))
            continue
        if row.get("prompt") is not None and row.get("messages") is None and row.get("conversations") is None:
            prompt = row["prompt"]
            if not isinstance(prompt, str):
                raise DataError(f"{where}: 'prompt' must be a string, got {type(prompt).__name__}")
            prompts.append(prompt)
            continue
        # An instruction row needs no answer to be a prompt.
        messages = parse_messages({"output": "", **row}, where)
        # Rows copied from training data end with the reference answer; the prompt is what
        # comes before it.
        if messages and messages[-1]["role"] == "assistant":
            messages = messages[:-1]
        if not messages or messages[-1]["role"] != "user":
            raise DataError(f"{where}: a prompt's messages must end with a user turn")
        prompts.append(messages)
    return prompts


def encode_prompt(tokenizer: Any, prompt: Prompt, chat: ChatTemplate = DEFAULT) -> list[int]:
    """Token ids of a prompt; with a chat template they end with the assistant header."""
    if isinstance(prompt, TokenPrompt):
        if prompt.ids and max(prompt.ids) >= len(tokenizer):
            raise DataError(f"{prompt.where}: token id {max(prompt.ids)} is outside the tokenizer's "
                            f"{len(tokenizer)} ids (a prompt tokenized for another model?)")
        return list(prompt.ids)
    if isinstance(prompt, str):
        if not has_chat_template(tokenizer, chat):
            # A base model without a template continues the raw text.
            return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
        prompt = [{"role": "user", "content": prompt}]
    text = render_chat(tokenizer, prompt, add_generation_prompt=True, chat=chat)
    return list(tokenizer(text, add_special_tokens=specials_for(tokenizer, chat))["input_ids"])
