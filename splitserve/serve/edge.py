"""The ASGI layer in front of the FastAPI app: what must hold for every request before any route
runs, and for every response after.

    arrival time     stamped on the scope (TTFT and queue time count from it)
    API key          /v1/* needs "Authorization: Bearer <key>" when one is set (401, as vLLM)
    media type       a POST whose Content-Type is not JSON -> 415 (none given is taken as JSON)
    body limits      Content-Length over the limit -> 413 at once; a body that grows past it
                     (chunked) -> 413; a body not complete within request_timeout_s -> 408
    error counting   every response status >= 400 goes to the metrics, whoever produced it

The body is read here, whole, and replayed to the app, so no route ever waits on a stalled
client: uvicorn's event loop holds the connection and the timeout frees it. Responses sent
from here close the connection, since the request body may be left unread.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time

from splitserve.serve.metrics import Metrics
from splitserve.serve.protocol import ApiError

ARRIVAL = "splitserve.arrival"  # scope key: time.perf_counter() when the request line arrived


class _TooLarge(Exception):
    pass


class _ClientGone(Exception):
    pass


async def send_json(send, status: int, obj: dict, headers: tuple = ()) -> None:
    data = json.dumps(obj).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            (b"connection", b"close"), *headers]})
    await send({"type": "http.response.body", "body": data})


class Edge:
    def __init__(self, app, metrics: Metrics, api_key: str | None, max_body_bytes: int, request_timeout_s: float):
        self.app, self.metrics = app, metrics
        self.api_key, self.max_body, self.timeout = api_key, max_body_bytes, request_timeout_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope[ARRIVAL] = time.perf_counter()

        async def counted(message) -> None:
            # 499: the route noticed the client had left; the worker counts that as cancelled
            if message["type"] == "http.response.start" and message["status"] >= 400 and message["status"] != 499:
                self.metrics.http_error(message["status"])
            await send(message)

        if self.api_key and scope["path"].startswith("/v1") and not self._authorized(scope):
            err = ApiError(401, "a valid API key is required: send 'Authorization: Bearer <key>'",
                           kind="authentication_error")
            await send_json(counted, 401, err.body(), ((b"www-authenticate", b"Bearer"),))
            return
        if scope["method"] == "POST":
            given = dict(scope["headers"]).get(b"content-type")
            if given is None:  # taken as JSON, which is what the routes read
                scope["headers"] = [*scope["headers"], (b"content-type", b"application/json")]
            elif not _is_json(given):
                err = ApiError(415, "the request body must be JSON: send 'Content-Type: application/json'",
                               kind="invalid_request_error")
                await send_json(counted, 415, err.body())
                return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and int(length) > self.max_body:  # h11 has checked it is a number
            await send_json(counted, 413, self._too_large().body())
            return
        if scope["method"] in ("POST", "PUT", "PATCH"):
            try:
                body = await self._read_body(receive)
            except _TooLarge:
                await send_json(counted, 413, self._too_large().body())
                return
            except TimeoutError:
                err = ApiError(408, f"the request body did not arrive within {self.timeout:g} s "
                               "(a Content-Length larger than the body sent?)", kind="timeout_error")
                await send_json(counted, 408, err.body())
                return
            except _ClientGone:
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, counted)

    def _authorized(self, scope) -> bool:
        given = dict(scope["headers"]).get(b"authorization", b"")
        return hmac.compare_digest(given, b"Bearer " + self.api_key.encode())

    def _too_large(self) -> ApiError:
        return ApiError(413, f"the request body must be at most {self.max_body} bytes", kind="invalid_request_error")

    async def _read_body(self, receive) -> bytes:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        chunks, size = [], 0
        while True:
            message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _is_json(content_type: bytes) -> bool:
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or media.endswith(b"+json")


def _replay(body: bytes, receive):
    """The app's receive: the buffered body once, then the connection's own messages (so the
    app still hears http.disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed():
        if pending:
            return pending.pop()
        return await receive()

    return replayed
