"""The OpenAI request/response shapes we serve: pydantic request models, the refuse-don't-ignore
policy, prompt encoding, and JSON builders.

Schema errors (a wrong type, a value out of range, a missing field) are pydantic's and come back
as a 400 naming each field, as vLLM answers them. A field the schema does not know is a 400
naming it: either one we know and refuse (`REFUSED`: it would change the output in a way the
lossless speculative sampler does not implement, so answering without it would be a silent
lie) unless it carries its neutral value, or one nobody defined (a typo).
`ServerConfig.ignore_fields` names fields to drop instead.
Everything renders as OpenAI's `{"error": {...}}`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from splitserve.data.chat import ChatTemplate, DataError, has_chat_template, template_arg_clash
from splitserve.data.formats import TEXT_PART_SEPARATOR
from splitserve.data.prompts import encode_prompt

ROLES = ("system", "user", "assistant", "developer", "tool")


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


# field -> (values that leave the output unchanged, why any other value is refused)
REFUSED: dict[str, tuple[tuple, str]] = {
    "n": ((1, None), "one sequence per request (the engine decodes batch 1)"),
    "best_of": ((1, None), "one sequence per request (the engine decodes batch 1)"),
    "use_beam_search": ((False, None), "no beam search"),
    "presence_penalty": ((0, None), "penalties change the target distribution the verifier keeps"),
    "frequency_penalty": ((0, None), "penalties change the target distribution the verifier keeps"),
    "repetition_penalty": ((1, None), "penalties change the target distribution the verifier keeps"),
    "logit_bias": (({}, None), "biases change the target distribution the verifier keeps"),
    "min_p": ((0, None), "only top_k and top_p truncation is implemented"),
    "min_tokens": ((0, None), "EOS is never suppressed"),
    "bad_words": (([], None), "banned tokens change the target distribution"),
    "stop_token_ids": (([], None), "use stop strings"),
    "logprobs": ((False, None), "log-probabilities are not returned"),
    "top_logprobs": ((0, None), "log-probabilities are not returned"),
    "prompt_logprobs": ((0, None), "log-probabilities are not returned"),
    "echo": ((False, None), "the prompt is not echoed"),
    "suffix": (("", None), "no insertion (suffix) completions"),
    "response_format": (({"type": "text"}, None), "no constrained (JSON / schema) decoding"),
    "guided_json": ((None,), "no constrained decoding"),
    "guided_regex": ((None,), "no constrained decoding"),
    "guided_choice": ((None,), "no constrained decoding"),
    "guided_grammar": ((None,), "no constrained decoding"),
    "structured_outputs": ((None,), "no constrained decoding"),
    "tools": (([], None), "no tool calling"),
    "tool_choice": (("none", None), "no tool calling"),
    "parallel_tool_calls": ((True, False, None), "no tool calling"),  # OpenAI's default is true
    "functions": (([], None), "no tool calling"),
    "function_call": (("none", None), "no tool calling"),
}
# Accepted and without effect on the output: metadata the client may always send.
HARMLESS = ("user", "metadata", "store", "service_tier")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False
    continuous_usage_stats: Literal[False] = False


def _drop_nulls(data: Any) -> Any:
    """OpenAI's clients may send every optional field, null where unset: null means the default."""
    return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class _Sampling(BaseModel):
    """Fields both routes share. extra="allow": unknown fields are collected and refused by
    `check_extra` (a 400 naming them), not by pydantic (whose 422 would not say why)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)  # OpenAI's default
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)  # vLLM's convention: 0 or -1 disables
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)  # what torch's generator takes
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(None)
    ignore_eos: bool = False  # vLLM's extension

    _nulls = model_validator(mode="before")(_drop_nulls)

    def stop_strings(self) -> list[str]:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stop) > 4:
            raise ApiError(400, "'stop' takes at most 4 strings", "stop")
        return [s for s in stop if s]

    def effective_max_tokens(self) -> int | None:
        return self.max_tokens


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


# Message fields OpenAI's own reply objects carry (a client may send a reply back as history):
# accepted empty, refused otherwise, since this server neither calls tools nor speaks audio.
# `refusal` is an assistant turn's text when its content is null; `annotations` cite sources.
MESSAGE_REFUSED = {"tool_calls": "no tool calling", "function_call": "no tool calling", "audio": "no audio"}
MESSAGE_IGNORED = ("annotations", "tool_call_id")


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal[ROLES]
    content: str | list[TextPart] | None = None
    name: str | None = None
    refusal: str | None = None

    def plain(self) -> dict:
        content = (self.content if isinstance(self.content, str)
                   else TEXT_PART_SEPARATOR.join(p.text for p in self.content or []))
        if self.content is None and self.refusal:
            content = self.refusal
        return {"role": "system" if self.role == "developer" else self.role, "content": content}

    def check_extra(self, where: str) -> None:
        for key, value in (self.model_extra or {}).items():
            if key in MESSAGE_IGNORED or value in (None, [], {}, ""):
                continue
            why = MESSAGE_REFUSED.get(key)
            msg = f"unsupported field '{key}' ({why})" if why else f"unknown field '{key}'"
            raise ApiError(400, f"{where}: {msg} (docs/serving.md lists the fields this server takes)", where)


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    chat_template_kwargs: dict[str, Any] | None = None  # passed to the tokenizer's apply_chat_template

    def effective_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]


def check_text(obj: Any, where: str = "body") -> None:
    """400 naming the first string that is not valid Unicode: JSON's \\ud800-style escapes can
    carry a lone UTF-16 surrogate, which no tokenizer (and no UTF-8 reply) can take."""
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(400, f"{where}: the text holds a lone UTF-16 surrogate (not valid Unicode)",
                           where) from None
    elif isinstance(obj, dict):
        for key, value in obj.items():
            check_text(key, where)
            check_text(value, f"{where}.{key}" if where != "body" else str(key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            check_text(value, f"{where}.{i}")


def check_extra(req: _Sampling, ignore: frozenset[str] = frozenset()) -> None:
    """400 naming every field the schema does not take: refused ones with the reason, unknown ones
    as such. A refused field at its neutral value, a harmless one, or one in `ignore` passes."""
    for i, message in enumerate(getattr(req, "messages", ())):
        message.check_extra(f"messages.{i}")
    refused, unknown = [], []
    for key, value in (req.model_extra or {}).items():
        if key in ignore or key in HARMLESS:
            continue
        if key in REFUSED:
            neutral, why = REFUSED[key]
            if value not in neutral:
                refused.append(f"'{key}' ({why})")
        else:
            unknown.append(f"'{key}'")
    parts = []
    if refused:
        parts.append("unsupported field" + ("s " if len(refused) > 1 else " ") + ", ".join(refused))
    if unknown:
        parts.append("unknown field" + ("s " if len(unknown) > 1 else " ") + ", ".join(unknown))
    if parts:
        first = (refused or unknown)[0].split("'")[1]
        raise ApiError(400, "; ".join(parts) + " (docs/serving.md lists the fields this server takes)", first)


def encode_chat(req: ChatCompletionRequest, tokenizer, chat_template: str | None = None) -> list[int]:
    """Token ids of the conversation followed by the assistant header, rendered exactly as
    training and evaluation render it. `chat_template` (the --chat-template file's text) replaces
    the tokenizer's own; chat_template_kwargs reach the template (e.g. Qwen3's enable_thinking)."""
    messages = [m.plain() for m in req.messages]
    chat = ChatTemplate(chat_template, dict(req.chat_template_kwargs or {}))
    clash = template_arg_clash(tokenizer, chat.kwargs)
    if clash:
        raise ApiError(400, f"chat_template_kwargs may not set '{clash}': the server sets the template call's "
                       "own arguments", "chat_template_kwargs")
    if not has_chat_template(tokenizer, chat):
        raise ApiError(400, "this model has no chat template (start the server with --chat-template, or use "
                       "/v1/completions)", "messages")
    try:
        return encode_prompt(tokenizer, messages, chat)
    except DataError as exc:  # a template error (raise_exception, an undefined variable) is the request's
        raise ApiError(400, f"{exc}", "messages") from None


def encode_completion(req: CompletionRequest, tokenizer) -> list[int]:
    prompt = req.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return list(tokenizer(prompt)["input_ids"])
    if prompt and all(isinstance(t, int) for t in prompt):
        vocab = len(tokenizer)
        if not all(0 <= t < vocab for t in prompt):
            raise ApiError(400, f"prompt token ids must be in [0, {vocab})", "prompt")
        return list(prompt)
    if not prompt:
        raise ApiError(400, "'prompt' is empty", "prompt")
    raise ApiError(400, "batches of several prompts are not supported (send one request per prompt)", "prompt")


# ---- responses ---------------------------------------------------------------------------


class Reply:
    """Builds the JSON objects of one response (ids and timestamps fixed at creation)."""

    def __init__(self, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    @staticmethod
    def usage(prompt_tokens: int, completion_tokens: int) -> dict:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    def full(self, text: str, finish_reason: str, usage: dict) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason}
            return {**self._head("chat.completion"), "choices": [choice], "usage": usage}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {**self._head("text_completion"), "choices": [choice], "usage": usage}

    def chunk(self, text: str | None, finish_reason: str | None = None, first: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": text or ""} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return {**self._head("text_completion"), "choices": [choice]}

    def usage_chunk(self, usage: dict) -> dict:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage}
