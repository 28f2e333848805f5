"""A chat client over several OpenAI-compatible servers at once (SGLang, vLLM, `splitserve serve`).

`gen --endpoint` sends each reply request to `/v1/chat/completions`, where the server applies
the target's own chat template. What a long regeneration job meets on the way is handled here:

    timeouts, dropped connections, 5xx, 429, bodies that are not a chat completion
        -> retried after a backoff that doubles (with jitter), each retry on the next endpoint
    other 4xx (a prompt past the context, a parameter the server refuses)
        -> not retried: the server has answered, and asking again gives the same answer

A request that fails for good raises `RequestFailed` with a short `reason` ("timeout",
"connection", "http_500", "http_400", "bad_response") that the caller records and counts.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

import httpx

from splitserve.config import EndpointConfig  # noqa: F401  (re-exported for callers)


class RequestFailed(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass
class ChatReply:
    content: str
    reasoning: str | None  # reasoning_content, where the server's reasoning parser split it off
    finish_reason: str | None  # "stop" | "length" | ...
    prompt_tokens: int | None
    completion_tokens: int | None


def _root(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _error_message(resp: httpx.Response) -> str:
    try:
        err = resp.json().get("error")
        if isinstance(err, dict):
            return str(err.get("message", err))[:300]
        if err:
            return str(err)[:300]
    except ValueError:
        pass
    return resp.text[:300] or resp.reason_phrase


def parse_reply(body: Any) -> ChatReply:
    """A chat completion body -> ChatReply; ValueError when it is not one."""
    try:
        choice = body["choices"][0]
        msg = choice["message"]
        content = msg.get("content") or ""
        reasoning = msg.get("reasoning_content", msg.get("reasoning"))
        usage = body.get("usage") or {}
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        raise ValueError(f"not a chat completion ({type(e).__name__}: {e})") from None
    if not isinstance(content, str) or (reasoning is not None and not isinstance(reasoning, str)):
        raise ValueError("message content is not text")
    return ChatReply(content, reasoning, choice.get("finish_reason"), usage.get("prompt_tokens"),
                     usage.get("completion_tokens"))


def _first_model_id(body: Any) -> str:
    try:
        return str(body["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        raise ValueError("/v1/models lists no model") from None


class EndpointPool:
    """`async with EndpointPool(cfg) as pool:` then `await pool.chat(body, slot)` from many tasks.

    `slot` picks the endpoint of the first attempt (slot % len(urls)), so callers spread over
    endpoints by numbering their workers; the pool itself holds no queue.
    """

    def __init__(self, cfg: EndpointConfig, seed: int = 0):
        cfg.check()
        self.cfg = cfg
        self.roots = [_root(u) for u in cfg.urls]
        self._rng = random.Random(seed)  # backoff jitter only
        self._client: httpx.AsyncClient | None = None
        self.retried: dict[str, int] = {}  # reason -> retries it caused

    async def __aenter__(self) -> EndpointPool:
        headers = {"Authorization": f"Bearer {self.cfg.api_key}"} if self.cfg.api_key else {}
        n = self.cfg.concurrency * len(self.roots)
        self._client = httpx.AsyncClient(
            headers=headers, timeout=httpx.Timeout(self.cfg.timeout_s),
            limits=httpx.Limits(max_connections=n, max_keepalive_connections=n))
        return self

    async def __aexit__(self, *exc) -> None:
        assert self._client is not None
        await self._client.aclose()

    async def model_id(self) -> str:
        """The served model's id, which must be the same on every endpoint."""
        ids = {}
        for slot, root in enumerate(self.roots):
            ids[root] = await self._call("GET", "/v1/models", None, slot, _first_model_id, move=False)
        if len(set(ids.values())) > 1:
            raise RequestFailed("mixed_models", f"the endpoints serve different models: {ids}")
        return next(iter(ids.values()))

    async def chat(self, body: dict[str, Any], slot: int = 0) -> ChatReply:
        return await self._call("POST", "/v1/chat/completions", body, slot, parse_reply)

    async def _call(self, method: str, path: str, body: dict | None, slot: int, parse, move: bool = True):
        """One request with the retry policy; `move`: each retry goes to the next endpoint."""
        for attempt in range(self.cfg.retries + 1):
            root = self.roots[(slot + attempt * move) % len(self.roots)]
            try:
                return parse(await self._request(method, root, path, body))
            except RequestFailed as e:
                final = e.reason.startswith("http_4") and e.reason != "http_429"
                if final or attempt == self.cfg.retries:
                    raise
                self.retried[e.reason] = self.retried.get(e.reason, 0) + 1
            except ValueError as e:
                if attempt == self.cfg.retries:
                    raise RequestFailed("bad_response", f"{root}{path}: {e}") from None
                self.retried["bad_response"] = self.retried.get("bad_response", 0) + 1
            delay = min(60.0, self.cfg.backoff_s * 2**attempt)
            await asyncio.sleep(delay * (0.5 + self._rng.random()))
        raise AssertionError("unreachable")

    async def _request(self, method: str, root: str, path: str, body: dict | None) -> Any:
        assert self._client is not None, "use the pool as `async with`"
        url = root + path
        try:
            resp = await self._client.request(method, url, json=body)
        except httpx.TimeoutException:
            raise RequestFailed("timeout", f"{url}: no answer within {self.cfg.timeout_s:g} s") from None
        except httpx.TransportError as e:  # refused, reset, closed mid-answer
            raise RequestFailed("connection", f"{url}: {type(e).__name__}: {e}") from None
        if resp.status_code != 200:
            raise RequestFailed(f"http_{resp.status_code}", f"{url}: {_error_message(resp)}")
        try:
            return resp.json()
        except ValueError:
            raise ValueError(f"{url} answered 200 with a body that is not JSON") from None
