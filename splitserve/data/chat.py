"""Chat data reading and tokenization with assistant-only loss masks.

A draft model only ever has to predict what the target generates, i.e. assistant turns, so
the loss mask covers exactly the assistant contents plus the end-of-turn token that closes
them (the draft must learn when a turn stops). Everything the user or the template supplies
is context only.

Assistant spans are found by rendering prefixes of the conversation with the tokenizer's own
chat template rather than by parsing a known format, so any template that renders prefixes
consistently works without template-specific code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from splitserve.data.rows import DataError, iter_rows

ROLES = ("system", "user", "assistant")

Message = dict[str, str]


# --------------------------------------------------------------------------- reading


def _check_messages(raw: Any, where: str) -> list[Message]:
    if not isinstance(raw, list):
        raise DataError(f"{where}: 'messages' must be a list, got {type(raw).__name__}")
    messages: list[Message] = []
    for j, msg in enumerate(raw):
        if not isinstance(msg, dict):
            raise DataError(f"{where}: messages[{j}] must be an object, got {type(msg).__name__}")
        for key in ("role", "content"):
            if key not in msg:
                raise DataError(f"{where}: messages[{j}] is missing '{key}'")
        role, content = msg["role"], msg["content"]
        if role not in ROLES:
            raise DataError(
                f"{where}: messages[{j}] has unknown role {role!r} (expected one of {ROLES})"
            )
        if not isinstance(content, str):
            raise DataError(
                f"{where}: messages[{j}].content must be a string, got {type(content).__name__}"
            )
        messages.append({"role": role, "content": content})
    return messages


def _require_str(row: dict, key: str, where: str) -> str:
    value = row[key]
    if not isinstance(value, str):
        raise DataError(f"{where}: '{key}' must be a string, got {type(value).__name__}")
    return value


def parse_messages(row: dict, where: str) -> list[Message]:
    """Turn one `messages` row or `prompt`/`response` row into a validated message list."""
    if "messages" in row:
        return _check_messages(row["messages"], where)
    if "prompt" in row and "response" in row:
        messages: list[Message] = []
        if "system" in row:
            messages.append({"role": "system", "content": _require_str(row, "system", where)})
        messages.append({"role": "user", "content": _require_str(row, "prompt", where)})
        messages.append({"role": "assistant", "content": _require_str(row, "response", where)})
        return messages
    raise DataError(f"{where}: expected a 'messages' list or 'prompt' and 'response' strings")


def read_conversations(path: str | Path) -> Iterator[tuple[int, list[Message]]]:
    """Yield (1-based row number, messages) for each conversation of a chat data file."""
    for lineno, row, where in iter_rows(path):
        yield lineno, parse_messages(row, where)


# --------------------------------------------------------------------------- rendering


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _fallback_render(tokenizer: Any, messages: list[Message], add_generation_prompt: bool) -> str:
    # The space after "Assistant:" belongs to the message, not the header, so a prompt never ends
    # in a bare space (BPE tokenizers glue a leading space to the next word). No BOS here: the
    # text is tokenized with the tokenizer's own special tokens, as plain text would be.
    eos = tokenizer.eos_token or ""
    parts: list[str] = []
    for msg in messages:
        if msg["role"] == "assistant":
            parts.append(f"Assistant: {msg['content']}{eos}\n")
        else:
            parts.append(f"{msg['role'].capitalize()}: {msg['content']}\n")
    if add_generation_prompt:
        parts.append("Assistant:")
    return "".join(parts)


def specials_for(tokenizer: Any) -> bool:
    """`add_special_tokens` for rendered text: a chat template already contains its specials."""
    return not has_chat_template(tokenizer)


def render_chat(
    tokenizer: Any, messages: list[Message], add_generation_prompt: bool = False
) -> str:
    """The conversation as text: the tokenizer's chat template, else a plain User/Assistant form."""
    if not has_chat_template(tokenizer):
        return _fallback_render(tokenizer, messages, add_generation_prompt)
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def _assistant_spans(
    tokenizer: Any, messages: list[Message], full: str, stop_at: int, where: str
) -> list[tuple[int, int]]:
    """Char spans of trained assistant text in `full`, the render of all of `messages`.

    Turns starting at or after char `stop_at` are not located: they fall past max_length, and
    each located turn costs two renders of a growing prefix (quadratic in the turn count).
    """
    spans: list[tuple[int, int]] = []
    for i, msg in enumerate(messages):
        # A blank reply would only teach "end the turn at once"; leave it untrained.
        if msg["role"] != "assistant" or not msg["content"].strip():
            continue
        upto = render_chat(tokenizer, messages[: i + 1])
        if not full.startswith(upto):
            raise DataError(
                f"{where}: the chat template renders messages[:{i + 1}] differently inside the "
                "full conversation, so assistant turns cannot be located"
            )
        if i == 0:
            # Templates cannot render an empty prefix; the reply is the last copy of its content.
            start = upto.rfind(msg["content"])
            if start < 0:
                raise DataError(
                    f"{where}: the chat template does not render messages[0]'s content verbatim, "
                    "so the assistant turn cannot be located"
                )
        else:
            prefix = render_chat(tokenizer, messages[:i], add_generation_prompt=True)
            if not upto.startswith(prefix):
                raise DataError(
                    f"{where}: the chat template's generation prompt for messages[{i}] is not a "
                    "prefix of the rendered reply, so assistant turns cannot be located"
                )
            start = len(prefix)
        if spans and start < spans[-1][1]:
            raise DataError(f"{where}: the chat template renders assistant turns out of order")
        if start >= stop_at:
            break
        # Whatever the template appends after the end-of-turn token (ChatML: "\n") is not
        # generated by the model, so it is not trained.
        end = len(upto.rstrip())
        if end > start:
            spans.append((start, end))
    return spans


# --------------------------------------------------------------------------- tokenizing


@dataclass
class TokenizedSample:
    input_ids: list[int]
    loss_mask: list[int]  # 1 where the token is assistant output the draft should predict
    source: str  # "path:line", for error messages and debugging
    truncated: bool


def tokenize_conversation(
    tokenizer: Any, messages: list[Message], max_length: int, source: str = "<conversation>"
) -> TokenizedSample | None:
    """Tokenize one conversation with an assistant-only loss mask; None if nothing is trainable."""
    if not any(m["role"] == "assistant" and m["content"].strip() for m in messages):
        return None
    text = render_chat(tokenizer, messages)
    enc = tokenizer(text, add_special_tokens=specials_for(tokenizer), return_offsets_mapping=True)
    truncated = len(enc["input_ids"]) > max_length
    input_ids: list[int] = list(enc["input_ids"][:max_length])
    offsets = enc["offset_mapping"][:max_length]
    stop_at = enc["offset_mapping"][max_length][0] if truncated else len(text)
    spans = _assistant_spans(tokenizer, messages, text, stop_at, source)
    # A token is trained when it starts inside an assistant span. Spans are sorted and disjoint,
    # so one forward sweep assigns every token.
    loss_mask = [0] * len(input_ids)
    k = 0
    for t, (a, _b) in enumerate(offsets):
        while k < len(spans) and a >= spans[k][1]:
            k += 1
        if k < len(spans) and spans[k][0] <= a:
            loss_mask[t] = 1
    if not any(loss_mask):
        return None
    return TokenizedSample(input_ids, loss_mask, source, truncated)


# --------------------------------------------------------------------------- loading


@dataclass
class DataStats:
    rows: int = 0
    samples: int = 0
    skipped_empty: int = 0  # no trainable assistant token (empty, or all of it past max_length)
    truncated: int = 0
    tokens: int = 0
    loss_tokens: int = 0

    def summary(self) -> str:
        return (
            f"{self.rows} rows -> {self.samples} samples, {self.skipped_empty} empty skipped, "
            f"{self.truncated} truncated to max_length, {self.tokens:,} tokens "
            f"({self.loss_tokens:,} trained)"
        )


def load_samples(
    path: str | Path, tokenizer: Any, max_length: int, limit: int | None = None
) -> tuple[list[TokenizedSample], DataStats]:
    """Read and tokenize a chat JSONL file, stopping after `limit` samples."""
    if max_length < 1:
        raise DataError(f"max_length must be positive, got {max_length}")
    samples: list[TokenizedSample] = []
    stats = DataStats()
    for lineno, messages in read_conversations(path):
        if limit is not None and len(samples) >= limit:
            break
        stats.rows += 1
        sample = tokenize_conversation(tokenizer, messages, max_length, source=f"{path}:{lineno}")
        if sample is None:
            stats.skipped_empty += 1
            continue
        samples.append(sample)
        stats.samples += 1
        stats.truncated += int(sample.truncated)
        stats.tokens += len(sample.input_ids)
        stats.loss_tokens += sum(sample.loss_mask)
    return samples, stats
