"""The OpenAI request/response shapes we serve: parsing with validation, and JSON builders.

Every invalid request becomes an `ApiError` (status, message, param) that the server renders as
OpenAI's `{"error": {...}}`. Parameters that would change the output distribution in ways the
lossless speculative sampler does not implement (top_p, penalties, logprobs, n > 1) are refused
rather than silently ignored.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from splitserve.data.chat import ChatTemplate, DataError, has_chat_template
from splitserve.data.prompts import encode_prompt

ROLES = ("system", "user", "assistant", "developer", "tool")


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


@dataclass
class Request:
    chat: bool
    prompt_ids: list[int]
    max_tokens: int | None  # None: up to the context limit
    temperature: float
    seed: int | None
    stream: bool
    include_usage: bool
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False


def _bad(msg: str, param: str | None = None) -> ApiError:
    return ApiError(400, msg, param)


def _number(body: dict, key: str, default: float, lo: float, hi: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _bad(f"'{key}' must be a number, got {v!r}", key)
    if not lo <= v <= hi:
        raise _bad(f"'{key}' must be between {lo:g} and {hi:g}, got {v}", key)
    return float(v)


def _int(body: dict, key: str, lo: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(f"'{key}' must be an integer, got {v!r}", key)
    if lo is not None and v < lo:
        raise _bad(f"'{key}' must be >= {lo}, got {v}", key)
    return v


def _refuse_unsupported(body: dict) -> None:
    if body.get("n", 1) != 1:
        raise _bad("only n=1 is supported (the engine decodes one sequence at a time)", "n")
    if body.get("top_p", 1) != 1:
        raise _bad("top_p is not supported: lossless speculative sampling draws from the full distribution; "
                   "use temperature", "top_p")
    for key in ("presence_penalty", "frequency_penalty"):
        if body.get(key, 0) not in (0, 0.0, None):
            raise _bad(f"'{key}' is not supported", key)
    for key in ("logprobs", "top_logprobs", "echo", "tools", "functions"):
        if body.get(key):
            raise _bad(f"'{key}' is not supported", key)
    if body.get("best_of") not in (None, 1):
        raise _bad("'best_of' is not supported", "best_of")


def _message_text(msg: Any, i: int) -> dict:
    where = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise _bad(f"{where} must be an object with 'role' and 'content'", "messages")
    role, content = msg.get("role"), msg.get("content")
    if role not in ROLES:
        raise _bad(f"{where}.role must be one of {list(ROLES)}, got {role!r}", "messages")
    if isinstance(content, list):  # content parts: text only
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise _bad(f"{where}.content: only text parts are supported", "messages")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise _bad(f"{where}.content must be a string", "messages")
    return {"role": "system" if role == "developer" else role, "content": content}


def _encode_chat(body: dict, tokenizer) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' is required: a non-empty list of {role, content}", "messages")
    if not has_chat_template(tokenizer):
        raise ApiError(400, "this model has no chat template; use /v1/completions", "messages")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise _bad("'chat_template_kwargs' must be an object, e.g. {\"enable_thinking\": false}",
                   "chat_template_kwargs")
    chat = [_message_text(m, i) for i, m in enumerate(messages)]
    try:  # as vLLM and SGLang: the kwargs reach the template, e.g. Qwen3's enable_thinking
        return encode_prompt(tokenizer, chat, ChatTemplate(kwargs=kwargs))
    except DataError as exc:
        raise _bad(f"the chat template failed on these messages: {exc}", "messages") from None


def _encode_completion(body: dict, tokenizer) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return list(tokenizer(prompt)["input_ids"])
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        vocab = len(tokenizer)
        if not all(0 <= t < vocab for t in prompt):
            raise _bad(f"prompt token ids must be in [0, {vocab})", "prompt")
        return list(prompt)
    if prompt is None:
        raise _bad("'prompt' is required: a string or a list of token ids", "prompt")
    raise _bad("'prompt' must be a string or a list of token ids (batches of several prompts are not supported)",
               "prompt")


def parse_request(raw: bytes, chat: bool, tokenizer, model_name: str) -> Request:
    try:
        body = json.loads(raw or b"")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _bad(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != model_name:
        raise ApiError(404, f"the model '{model}' does not exist; this server serves '{model_name}'", "model",
                       "not_found_error")
    _refuse_unsupported(body)
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, key, lo=1)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    seed = _int(body, "seed")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean", "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise _bad("'stream_options' must be an object", "stream_options")
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else (stop or [])
    if not (isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 4):
        raise _bad("'stop' must be a string or a list of at most 4 strings", "stop")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise _bad("'ignore_eos' must be a boolean", "ignore_eos")
    ids = _encode_chat(body, tokenizer) if chat else _encode_completion(body, tokenizer)
    return Request(chat, ids, max_tokens, temperature, seed, stream, bool(opts.get("include_usage")), stop, ignore_eos)


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
