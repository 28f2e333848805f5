"""Chat rendering and tokenization with assistant-only loss masks.

A draft model only ever has to predict what the target generates, i.e. assistant turns, so
the loss mask covers exactly the assistant replies plus the end-of-turn token that closes
them (the draft must learn when a turn stops). Everything the user or the template supplies
is context only.

Which tokens a reply is, two ways, the first that applies:
1. The template marks replies itself with `{% generation %}` blocks: transformers'
   `return_assistant_tokens_mask` gives the mask.
2. Otherwise the conversation is rendered once and each reply located in it. A reply starts where
   the template's generation prompt for the conversation before it ends, when that prompt is a
   prefix of the full render (Llama, SmolLM2/ChatML: exact); templates that draw the prompt
   differently from a reply inside a longer conversation (Qwen3 with enable_thinking=false puts
   an empty think block in the prompt only) start it at the reply's own text instead. It ends
   after its text and the end-of-turn marker the template puts right after it. A reply that is
   the last turn may render differently from one that is not (Qwen3's think block), so nothing
   assumes a rendered prefix of the conversation reappears inside it except the context before
   each reply.
"""

from __future__ import annotations

import inspect
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from splitserve.data.formats import Message, parse_messages  # noqa: F401  (re-exported)
from splitserve.data.rows import DataError, iter_rows

GENERATION_BLOCK = re.compile(r"{%-?\s*generation\s*-?%}")


@dataclass(frozen=True)
class ChatTemplate:
    """How conversations are rendered: the tokenizer's own template unless `template` replaces it,
    with `kwargs` handed to the template (e.g. {"enable_thinking": False})."""

    template: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    source: str | None = None  # the file `template` was read from, for messages

    @classmethod
    def load(cls, path: str | None = None, kwargs: dict[str, Any] | None = None) -> ChatTemplate:
        """From a Jinja file (None: keep the tokenizer's) and template kwargs."""
        if kwargs is not None and not isinstance(kwargs, dict):
            raise DataError(f"chat_template_kwargs must be a mapping, got {type(kwargs).__name__}")
        text = None
        if path:
            try:
                text = Path(path).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise DataError(f"chat template {path}: cannot be read ({e})") from None
            if not text.strip():
                raise DataError(f"chat template {path}: empty file")
        return cls(text, dict(kwargs or {}), path)

    def text_for(self, tokenizer: Any) -> str | None:
        return self.template or getattr(tokenizer, "chat_template", None) or None


DEFAULT = ChatTemplate()


# --------------------------------------------------------------------------- reading


def read_conversations(path: str | Path) -> Iterator[tuple[int, list[Message]]]:
    """Yield (1-based row number, messages) for each conversation of a chat data path; a bad row raises."""
    for lineno, row, where in iter_rows(path):
        yield lineno, parse_messages(row, where)


# --------------------------------------------------------------------------- rendering


def has_chat_template(tokenizer: Any, chat: ChatTemplate = DEFAULT) -> bool:
    return bool(chat.text_for(tokenizer))


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


def template_arg_clash(tokenizer: Any, kwargs: dict[str, Any]) -> str | None:
    """The first of `kwargs` that names one of apply_chat_template's own parameters
    (add_generation_prompt, tokenize, ...) or `messages`: those are set by the call, not by the
    template's own variables, and passing them twice is a TypeError inside the call."""
    try:
        params = inspect.signature(tokenizer.apply_chat_template).parameters
    except (AttributeError, TypeError, ValueError):
        return None
    own = {name for name, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    own.add("messages")  # the conversation's name inside the template
    return next((k for k in kwargs if k in own), None)


def _check_kwargs(tokenizer: Any, chat: ChatTemplate) -> None:
    clash = template_arg_clash(tokenizer, chat.kwargs)
    if clash:
        raise DataError(f"chat_template_kwargs may not set '{clash}': it is an argument of the template call "
                        "itself, not a template variable")


def specials_for(tokenizer: Any, chat: ChatTemplate = DEFAULT) -> bool:
    """`add_special_tokens` for rendered text: a chat template already contains its specials."""
    return not has_chat_template(tokenizer, chat)


def render_chat(
    tokenizer: Any, messages: list[Message], add_generation_prompt: bool = False, chat: ChatTemplate = DEFAULT
) -> str:
    """The conversation as text: the chat template, else a plain User/Assistant form."""
    template = chat.text_for(tokenizer)
    if not template:
        return _fallback_render(tokenizer, messages, add_generation_prompt)
    _check_kwargs(tokenizer, chat)
    try:
        return tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt,
            **chat.kwargs,
        )
    except Exception as e:  # noqa: BLE001 - jinja raises its own types, templates raise_exception(...)
        raise DataError(f"the chat template failed on this conversation ({type(e).__name__}: {e})") from None


def _reply_text(content: str) -> list[str]:
    """What of a reply's content a template renders verbatim, most likely first: the content
    itself, or (for templates that drop an earlier turn's reasoning) what follows '</think>'."""
    core = content.strip()
    out = [core]
    if "</think>" in core:
        out.append(core.split("</think>")[-1].strip())
    return [c for c in out if c]


def _find_reply(full: str, content: str, base: int, floor: int) -> tuple[int, str] | None:
    """(char, text) of the first rendering of a reply's content at or after `base` (else `floor`)."""
    for lo in dict.fromkeys((base, floor)):
        for text in _reply_text(content):
            at = full.find(text, lo)
            if at >= 0:
                return at, text
    return None


def _assistant_spans(
    tokenizer: Any, messages: list[Message], full: str, stop_at: int, chat: ChatTemplate
) -> list[tuple[int, int]]:
    """Char spans of trained assistant text in `full`, the render of all of `messages`.

    Turns starting at or after char `stop_at` are not located: they fall past max_length, and
    each located turn costs two renders of a growing prefix (quadratic in the turn count).
    """
    spans: list[tuple[int, int]] = []
    floor = 0  # nothing before this char can belong to the next reply
    for i, msg in enumerate(messages):
        # A blank reply would only teach "end the turn at once"; leave it untrained.
        if msg["role"] != "assistant" or not msg["content"].strip():
            continue
        start, base = None, floor
        if i > 0:
            prompt = render_chat(tokenizer, messages[:i], add_generation_prompt=True, chat=chat)
            if full.startswith(prompt):
                start = base = floor = len(prompt)
            else:
                context = render_chat(tokenizer, messages[:i], chat=chat)
                if not full.startswith(context):
                    raise DataError(
                        f"the chat template renders messages[:{i}] differently inside the full conversation, "
                        f"so assistant turn {i} cannot be located"
                    )
                floor = max(floor, len(context))
                # The reply's header is where the prompt and the render part ways; its text follows.
                base = max(floor, len(os.path.commonprefix([prompt, full])))
        if floor >= stop_at:
            break
        found = _find_reply(full, msg["content"], base, floor)
        if found is None:
            raise DataError(f"the chat template does not render messages[{i}]'s content verbatim, "
                            "so the assistant turn cannot be located")
        at, text = found
        start = at if start is None else start
        end = at + len(text)
        # The end-of-turn marker is whatever the template writes right after the reply when it is
        # the last turn (<|im_end|>, <|eot_id|>, ...), if it writes the same inside the conversation;
        # what follows that marker (ChatML: "\n") is not generated by the model, so not trained.
        alone = full if i + 1 == len(messages) else render_chat(tokenizer, messages[: i + 1], chat=chat)
        tail = alone[alone.rfind(text) + len(text):].rstrip()
        if tail and full.startswith(tail, end):
            end += len(tail)
        spans.append((start, end))
        floor = end
    return spans


# --------------------------------------------------------------------------- tokenizing


@dataclass
class TokenizedSample:
    input_ids: list[int]
    loss_mask: list[int]  # 1 where the token is assistant output the draft should predict
    source: str  # "path:line", for error messages and debugging
    truncated: bool


def uses_generation_blocks(tokenizer: Any, chat: ChatTemplate = DEFAULT) -> bool:
    return bool(GENERATION_BLOCK.search(chat.text_for(tokenizer) or ""))


def _marked(tokenizer: Any, messages: list[Message], chat: ChatTemplate) -> tuple[list[int], list[int]]:
    _check_kwargs(tokenizer, chat)
    try:
        enc = tokenizer.apply_chat_template(
            messages, chat_template=chat.text_for(tokenizer), tokenize=True, return_dict=True,
            return_assistant_tokens_mask=True, **chat.kwargs,
        )
    except Exception as e:  # noqa: BLE001 - as in render_chat
        raise DataError(f"the chat template failed on this conversation ({type(e).__name__}: {e})") from None
    return list(enc["input_ids"]), list(enc["assistant_masks"])


def _located(
    tokenizer: Any, messages: list[Message], max_length: int, chat: ChatTemplate
) -> tuple[list[int], list[int]]:
    text = render_chat(tokenizer, messages, chat=chat)
    enc = tokenizer(text, add_special_tokens=specials_for(tokenizer, chat), return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    stop_at = offsets[max_length][0] if len(ids) > max_length else len(text)
    spans = _assistant_spans(tokenizer, messages, text, stop_at, chat)
    # A token is trained when it starts inside an assistant span. Spans are sorted and disjoint,
    # so one forward sweep assigns every token.
    mask = [0] * len(ids)
    k = 0
    for t, (a, _b) in enumerate(offsets):
        while k < len(spans) and a >= spans[k][1]:
            k += 1
        if k < len(spans) and spans[k][0] <= a:
            mask[t] = 1
    return ids, mask


LOSS_ON = ("assistant", "all")


def after_first(n: int) -> list[int]:
    """The loss mask that trains every token of n after the first (nothing predicts the first)."""
    return [0] + [1] * (n - 1)


def cut_sample(ids: list[int], mask: list[int], max_length: int, source: str) -> TokenizedSample | None:
    """ids and mask cut to max_length -> a sample, or None when nothing is left to train."""
    truncated = len(ids) > max_length
    ids, mask = ids[:max_length], mask[:max_length]
    if not any(mask):
        return None
    return TokenizedSample(ids, mask, source, truncated)


def _whole(tokenizer: Any, messages: list[Message], chat: ChatTemplate) -> tuple[list[int], list[int]]:
    """Every token after the first is trained: the rendered conversation, whoever wrote it."""
    text = render_chat(tokenizer, messages, chat=chat)
    ids = list(tokenizer(text, add_special_tokens=specials_for(tokenizer, chat))["input_ids"])
    return ids, after_first(len(ids))


def tokenize_conversation(
    tokenizer: Any, messages: list[Message], max_length: int, source: str = "<conversation>",
    chat: ChatTemplate = DEFAULT, loss_on: str = "assistant",
) -> TokenizedSample | None:
    """Tokenize one conversation with a loss mask over its assistant replies (loss_on
    "assistant") or over every token after the first ("all"); None if nothing is trainable.

    Raises `DataError` (prefixed with `source`) when the replies cannot be located."""
    if loss_on not in LOSS_ON:
        raise ValueError(f"data.loss_on must be one of {', '.join(LOSS_ON)}, got {loss_on!r}")
    if loss_on == "assistant" and not any(m["role"] == "assistant" and m["content"].strip() for m in messages):
        return None
    try:
        if loss_on == "all":
            ids, mask = _whole(tokenizer, messages, chat)
        elif uses_generation_blocks(tokenizer, chat):
            ids, mask = _marked(tokenizer, messages, chat)
        else:
            ids, mask = _located(tokenizer, messages, max_length, chat)
    except DataError as e:
        raise DataError(f"{source}: {e}") from None
    return cut_sample(ids, mask, max_length, source)
