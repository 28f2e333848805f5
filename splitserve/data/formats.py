"""Row shapes users bring, mapped to one schema: a list of {"role", "content"} messages.

    {"messages": [{"role", "content"}, ...]}          OpenAI chat (roles system/user/assistant/tool)
    {"conversations": [{"from", "value"}, ...]}       ShareGPT (from: system/human/gpt/tool, and aliases)
    {"prompt", "response"} (+ optional "system")      single turn
    {"instruction", "output"} (+ "input", "system")   Alpaca-style single turn; "input" follows the
                                                      instruction after a blank line

An OpenAI message's content may also be a list of parts; its text parts
(`{"type": "text", "text": ...}`) are joined into one string with a newline between parts (as vLLM
joins them for a chat template that takes a string; SGLang joins with a space), and a part of any
other type (an image, audio, a file) makes the row malformed: the draft is trained on text only.

Besides role and content a message keeps the string fields chat templates read
(`reasoning_content`, `name`, `tool_call_id`) and an assistant's `tool_calls`, so a template renders
a turn as the model saw it. Any fault raises a `DataError` naming the row and the message.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from splitserve.data.rows import DataError

ROLES = ("system", "user", "assistant", "tool")
# ShareGPT speaker names seen in the wild -> roles.
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "model": "assistant", "chatgpt": "assistant", "bing": "assistant",
    "tool": "tool", "function": "tool", "observation": "tool", "function_response": "tool",
}
EXTRA_STRING_FIELDS = ("reasoning_content", "name", "tool_call_id")

Message = dict[str, Any]


def _message(role: str, content: Any, src: dict, where: str, j: int, key: str) -> Message:
    if content is None and role == "assistant" and src.get("tool_calls"):
        content = ""  # an assistant turn that only calls tools
    if not isinstance(content, str):
        raise DataError(f"{where}: {key}[{j}] content must be a string, got {type(content).__name__}")
    msg: Message = {"role": role, "content": content}
    for name in EXTRA_STRING_FIELDS:
        if isinstance(src.get(name), str):
            msg[name] = src[name]
    if role == "assistant" and isinstance(src.get("tool_calls"), list) and src["tool_calls"]:
        msg["tool_calls"] = src["tool_calls"]
    return msg


# Between the text parts of one message: vLLM's separator, so a multi-part message is trained on
# as vLLM renders it when the draft is served there (splitserve serve joins with it too).
TEXT_PART_SEPARATOR = "\n"


def _text_parts(content: Any, where: str, j: int) -> Any:
    """OpenAI content given as a list of parts -> its text parts joined; anything else unchanged."""
    if not isinstance(content, list):
        return content
    texts: list[str] = []
    for k, part in enumerate(content):
        if not isinstance(part, dict):
            raise DataError(f"{where}: messages[{j}] content[{k}] must be a content part object, "
                            f"got {type(part).__name__}")
        if part.get("type") != "text":
            raise DataError(f"{where}: messages[{j}] content[{k}] has type {part.get('type')!r}: "
                            "non-text parts are not supported")
        if not isinstance(part.get("text"), str):
            raise DataError(f"{where}: messages[{j}] content[{k}] 'text' must be a string, "
                            f"got {type(part.get('text')).__name__}")
        texts.append(part["text"])
    return TEXT_PART_SEPARATOR.join(texts)


def _turns(raw: Any, where: str, key: str, fields: tuple[str, str]) -> Iterator[tuple[int, dict]]:
    """(index, turn) of a row's turn list, each checked to be an object holding `fields`."""
    if not isinstance(raw, list):
        raise DataError(f"{where}: '{key}' must be a list, got {type(raw).__name__}")
    for j, turn in enumerate(raw):
        if not isinstance(turn, dict):
            raise DataError(f"{where}: {key}[{j}] must be an object, got {type(turn).__name__}")
        for name in fields:
            if name not in turn:
                raise DataError(f"{where}: {key}[{j}] is missing '{name}'")
        yield j, turn


def _openai(raw: Any, where: str) -> list[Message]:
    messages: list[Message] = []
    for j, msg in _turns(raw, where, "messages", ("role", "content")):
        if msg["role"] not in ROLES:
            raise DataError(f"{where}: messages[{j}] has unknown role {msg['role']!r} (expected one of {ROLES})")
        content = _text_parts(msg["content"], where, j)
        messages.append(_message(msg["role"], content, msg, where, j, "messages"))
    return messages


def _sharegpt(raw: Any, where: str) -> list[Message]:
    messages: list[Message] = []
    for j, turn in _turns(raw, where, "conversations", ("from", "value")):
        speaker = turn["from"]
        role = SHAREGPT_ROLES.get(speaker.lower()) if isinstance(speaker, str) else None
        if role is None:
            raise DataError(
                f"{where}: conversations[{j}] has unknown speaker {speaker!r} (expected one of "
                f"{sorted(SHAREGPT_ROLES)})"
            )
        messages.append(_message(role, turn["value"], turn, where, j, "conversations"))
    return messages


def _require_str(row: dict, key: str, where: str) -> str:
    value = row[key]
    if not isinstance(value, str):
        raise DataError(f"{where}: '{key}' must be a string, got {type(value).__name__}")
    return value


def _single_turn(row: dict, prompt: str, answer: str, where: str) -> list[Message]:
    messages: list[Message] = []
    if row.get("system") is not None:
        messages.append({"role": "system", "content": _require_str(row, "system", where)})
    messages.append({"role": "user", "content": prompt})
    messages.append({"role": "assistant", "content": answer})
    return messages


def parse_messages(row: dict, where: str) -> list[Message]:
    """Any supported row shape -> a validated message list (the columnar formats fill absent
    columns with None, so a None field counts as absent)."""
    if row.get("messages") is not None:
        return _openai(row["messages"], where)
    if row.get("conversations") is not None:
        return _sharegpt(row["conversations"], where)
    if row.get("prompt") is not None and "response" in row:
        return _single_turn(row, _require_str(row, "prompt", where), _require_str(row, "response", where), where)
    if row.get("instruction") is not None and "output" in row:
        prompt = _require_str(row, "instruction", where)
        if row.get("input"):
            prompt = f"{prompt}\n\n{_require_str(row, 'input', where)}"
        return _single_turn(row, prompt, _require_str(row, "output", where), where)
    raise DataError(
        f"{where}: unknown row format (expected 'messages', ShareGPT 'conversations', "
        f"'prompt' and 'response', or 'instruction' and 'output'; or pre-tokenized "
        f"'input_ids'; got keys {sorted(row)})"
    )
