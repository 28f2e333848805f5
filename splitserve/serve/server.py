"""`splitserve serve`: an OpenAI-compatible HTTP server (FastAPI on uvicorn) over the batch-1 engine.

    POST /v1/completions, /v1/chat/completions   JSON, or SSE streaming (stream=true)
    GET  /v1/models, /v1/models/{id}, /health, /metrics   Prometheus text on /metrics (metrics.py)

Routes run on uvicorn's event loop: they validate (pydantic models in protocol.py), tokenize,
queue and write. The engine lives on one worker thread (worker.py, FIFO, batch 1); it wakes the
waiting route through the loop, so a queued request holds no thread. `edge.py` sits in front:
API key, body size and read timeout, error counting. A streaming client that leaves is seen by
Starlette's disconnect listener, a non-streaming one by polling; either way the job is
cancelled and the engine is free at the next round boundary.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from splitserve.config import ServerConfig
from splitserve.serve.detok import TextStream
from splitserve.serve.edge import ARRIVAL, Edge
from splitserve.serve.metrics import CONTENT_TYPE, Metrics
from splitserve.serve.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    Reply,
    check_extra,
    check_text,
    encode_chat,
    encode_completion,
)
from splitserve.serve.worker import EngineWorker, Job, QueueFullError
from splitserve.speculative.engine import ContextLengthError, Engine, SamplingParams

log = logging.getLogger("splitserve.serve")
CLIENT_CHECK_S = 0.25  # how often a waiting non-streaming route looks for a client that left
KINDS = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
         405: "invalid_request_error"}


class ClientGone(Exception):
    pass


def bind_socket(host: str, port: int) -> socket.socket:
    """Listen on host:port now, before any weights load, so a port in use is a one-line error."""
    from splitserve.errors import UserError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a TIME_WAIT port, not a live one
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserError(f"--port {port}: cannot listen on {host}:{port}: {exc.strerror or exc} "
                        "(another server there? pick another --port)") from None
    sock.listen(2048)
    return sock


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    parts, first = [], None
    for err in exc.errors():
        if err.get("type") == "json_invalid":  # its loc is (body, character offset), not a field
            pos = (list(err.get("loc", ())) + [None, None])[1]
            why = (err.get("ctx") or {}).get("error", "not JSON")
            return f"the body is not valid JSON ({why}" + (f", at character {pos})" if pos is not None else ")"), None
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        where = ".".join(loc) or "body"
        first = first or (loc[0] if loc else None)
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts[:8]), first


class SplitServer:
    def __init__(self, engine: Engine, tokenizer, eos_ids: frozenset[int], cfg: ServerConfig, model_name: str,
                 sock: socket.socket | None = None, chat_template: str | None = None):
        self.engine, self.tokenizer, self.eos_ids, self.cfg = engine, tokenizer, eos_ids, cfg
        self.model_name, self.chat_template = model_name, chat_template
        self.ignore = frozenset(cfg.ignore_fields)
        self.metrics = Metrics(model_name, engine.gamma)
        self.worker = EngineWorker(engine, self.metrics, cfg.max_queue)
        self.sock = sock or bind_socket(cfg.host, cfg.port)
        self.server_address = self.sock.getsockname()[:2]
        self.app = self._build_app()
        asgi = Edge(self.app, self.metrics, cfg.api_key, cfg.max_body_bytes, cfg.request_timeout_s)
        self._uv = uvicorn.Server(uvicorn.Config(asgi, timeout_keep_alive=cfg.keep_alive_s, log_level="warning",
                                                 access_log=False, lifespan="off"))
        self._thread: threading.Thread | None = None
        self.worker.start()

    @property
    def url(self) -> str:
        host, port = self.server_address
        return f"http://{host}:{port}"

    def serve_forever(self) -> None:
        self._uv.run(sockets=[self.sock])

    def start_background(self) -> threading.Thread:
        self._thread = threading.Thread(target=self.serve_forever, name="splitserve-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 60  # a bound for a broken start, not a timing claim
        while not self._uv.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the HTTP server did not start")
            time.sleep(0.01)
        return self._thread

    def close(self) -> None:
        self._uv.should_exit = True
        if self._thread is not None:
            self._thread.join(30)
        self.sock.close()
        self.worker.stop()

    # ---- the app ------------------------------------------------------------------------

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="splitserve", docs_url=None, redoc_url=None, openapi_url=None)

        @app.exception_handler(ApiError)
        async def api_error(request: Request, exc: ApiError):
            headers = {"Retry-After": "1"} if exc.status == 503 else None  # the queue drains by the second
            return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

        @app.exception_handler(HTTPException)
        async def http_error(request: Request, exc: HTTPException):  # 404 and 405 from the router
            detail = exc.detail if exc.status_code != 404 else f"no route {request.method} {request.url.path}"
            err = ApiError(exc.status_code, str(detail), kind=KINDS.get(exc.status_code, "invalid_request_error"))
            return JSONResponse(err.body(), status_code=exc.status_code, headers=exc.headers)

        @app.exception_handler(RequestValidationError)
        async def invalid(request: Request, exc: RequestValidationError):
            message, param = _validation_message(exc)
            # 400, as vLLM and OpenAI answer a malformed request (FastAPI's own default is 422)
            return JSONResponse(ApiError(400, message, param).body(), status_code=400)

        @app.exception_handler(Exception)
        async def bug(request: Request, exc: Exception):  # a bug must not take the server down
            log.exception("request handling failed")
            err = ApiError(500, f"{type(exc).__name__}: {exc}", kind="server_error")
            return JSONResponse(err.body(), status_code=500)

        @app.api_route("/health", methods=["GET", "HEAD"])
        async def health():
            return {"status": "ok"}

        @app.get("/metrics")
        async def metrics():
            return Response(self.metrics.render(), media_type=CONTENT_TYPE)

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [self._model_card()]}

        @app.get("/v1/models/{model_id:path}")
        async def model(model_id: str):
            if model_id != self.model_name:
                raise ApiError(404, f"the model '{model_id}' does not exist; this server serves '{self.model_name}'",
                               "model", "not_found_error")
            return self._model_card()

        @app.post("/v1/completions")
        async def completions(body: CompletionRequest, request: Request):
            return await self._generate(body, request, chat=False)

        @app.post("/v1/chat/completions")
        async def chat_completions(body: ChatCompletionRequest, request: Request):
            return await self._generate(body, request, chat=True)

        return app

    # ---- one request --------------------------------------------------------------------

    def _model_card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": 0, "owned_by": "splitserve",
                "max_model_len": self.engine.max_context}

    async def _generate(self, req, request: Request, chat: bool):
        check_text(req.model_dump())
        check_extra(req, self.ignore)
        if req.model is not None and req.model != self.model_name:
            raise ApiError(404, f"the model '{req.model}' does not exist; this server serves '{self.model_name}'",
                           "model", "not_found_error")
        stop = req.stop_strings()
        ids = encode_chat(req, self.tokenizer, self.chat_template) if chat else encode_completion(req, self.tokenizer)
        params = self._params(req, ids, chat)
        loop = asyncio.get_running_loop()
        woke = asyncio.Event()
        try:
            job = self.worker.submit(ids, params, request.scope.get(ARRIVAL), wake=lambda: loop.call_soon_threadsafe(
                woke.set))
        except QueueFullError as exc:
            raise ApiError(503, str(exc), kind="server_overloaded") from None
        reply = Reply(chat, self.model_name)
        text = TextStream(self.tokenizer, stop)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        if req.stream:
            return StreamingResponse(self._stream(job, woke, text, reply, len(ids), include_usage),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        parts, end = [], None
        try:
            async for delta, end in self._events(job, woke, text, request):
                parts.append(delta)
        except ClientGone:
            job.cancel()
            log.info("client disconnected; generation cancelled")
            return Response(status_code=499)  # nobody reads it; nginx's "client closed request"
        finish, count = end
        return JSONResponse(reply.full("".join(parts), finish, reply.usage(len(ids), count)))

    def _params(self, req, ids: list[int], chat: bool) -> SamplingParams:
        engine = self.engine
        max_tokens = req.effective_max_tokens()
        try:
            max_tokens = max_tokens or max(1, engine.max_context - len(ids))
            engine.check_fits(len(ids), max_tokens)
        except ContextLengthError as exc:
            raise ApiError(400, str(exc), "messages" if chat else "prompt") from None
        eos = frozenset() if req.ignore_eos else self.eos_ids
        top_k = max(0, req.top_k)  # -1 (vLLM's "off") and 0 mean all tokens
        return SamplingParams(max_tokens=max_tokens, temperature=req.temperature, seed=req.seed, eos_ids=eos,
                              top_k=top_k, top_p=req.top_p)

    async def _events(self, job: Job, woke: asyncio.Event, text: TextStream, request: Request | None = None):
        """-> (text delta, None) per round, then ("", (finish_reason, completion tokens)).
        With `request` (non-streaming), a wait also checks the client is still there."""
        count, checked = 0, time.monotonic()
        while True:
            if request is not None and time.monotonic() - checked >= CLIENT_CHECK_S:
                checked = time.monotonic()  # by the clock: events may arrive faster than that
                if await request.is_disconnected():
                    raise ClientGone
            try:
                kind, value = job.events.get_nowait()
            except queue.Empty:
                woke.clear()
                if job.events.empty():  # nothing slipped in between: sleep until the worker wakes us
                    try:
                        await asyncio.wait_for(woke.wait(), CLIENT_CHECK_S)
                    except TimeoutError:
                        pass
                continue
            if kind == "tokens":
                count += len(value)
                delta = text.push(value)
                if text.stopped:  # a stop string: the reply is complete, the engine may stop
                    job.cancel("stop")
                    yield delta, ("stop", count)
                    return
                yield delta, None
            elif kind == "done":
                finish = "stop" if value.finish_reason == "stop" else "length"
                yield text.finish(), (finish, len(value.tokens))
                return
            else:
                raise ApiError(500, value, kind="server_error")

    async def _stream(self, job: Job, woke: asyncio.Event, text: TextStream, reply: Reply, prompt_len: int,
                      include_usage: bool):
        """SSE events. Starlette cancels this generator when the client disconnects; the
        finally cancels the job, and the engine stops at the next round."""
        done = False
        try:
            if reply.chat:
                yield _sse(reply.chunk("", first=True))
            try:
                async for delta, end in self._events(job, woke, text):
                    if delta:
                        yield _sse(reply.chunk(delta))
                    if end is not None:
                        finish, count = end
                        yield _sse(reply.chunk(None, finish))
                        if include_usage:
                            yield _sse(reply.usage_chunk(reply.usage(prompt_len, count)))
            except ApiError as err:  # headers are out: report in-band, as OpenAI does
                self.metrics.http_error(err.status)
                yield _sse(err.body())
            yield "data: [DONE]\n\n"
            done = True
        finally:
            if not done:
                job.cancel()
                log.info("client disconnected; generation cancelled")


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def build_server(engine: Engine, tokenizer, eos_ids: frozenset[int], cfg: ServerConfig, model_name: str,
                 sock: socket.socket | None = None, chat_template: str | None = None) -> SplitServer:
    return SplitServer(engine, tokenizer, eos_ids, cfg, model_name, sock, chat_template)
