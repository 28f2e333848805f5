"""`splitserve serve`: an OpenAI-compatible HTTP server over the batch-1 engine (stdlib only).

    POST /v1/completions, /v1/chat/completions   JSON or SSE streaming (stream=true)
    GET  /v1/models, /health, /metrics            Prometheus text on /metrics

ThreadingHTTPServer gives each connection a thread; those threads only parse, tokenize, queue
and write. The engine lives on one worker thread (worker.py). A client that disconnects
mid-stream is noticed on the next write and its job is cancelled, which frees the engine at the
next round boundary.
"""

from __future__ import annotations

import json
import logging
import queue
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from splitserve.serve.config import ServerConfig
from splitserve.serve.detok import TextStream
from splitserve.serve.engine import ContextLengthError, Engine, SamplingParams
from splitserve.serve.metrics import Metrics
from splitserve.serve.protocol import ApiError, Reply, Request, parse_request
from splitserve.serve.worker import EngineWorker, Job, QueueFullError

log = logging.getLogger("splitserve.serve")
DISCONNECTS = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)
CLIENT_CHECK_S = 0.25  # how often a waiting handler looks for a client that left


class SplitServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, engine: Engine, tokenizer, eos_ids: frozenset[int], cfg: ServerConfig, model_name: str):
        self.engine, self.tokenizer, self.eos_ids, self.cfg = engine, tokenizer, eos_ids, cfg
        self.model_name = model_name
        # Fast tokenizers refuse concurrent use from threads ("Already borrowed"); encode and
        # decode are short, so one lock for both.
        self.tokenizer_lock = threading.Lock()
        self.metrics = Metrics()
        self.worker = EngineWorker(engine, self.metrics, cfg.max_queue)
        super().__init__((cfg.host, cfg.port), Handler)
        self.worker.start()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def start_background(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="splitserve-http", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.worker.stop()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: SplitServer

    def log_message(self, fmt, *args):  # route access logs through logging, not stderr
        log.debug("%s - %s", self.address_string(), fmt % args)

    # ---- plumbing -----------------------------------------------------------------------

    def _send_json(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_text(self, status: int, text: str, content_type: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, err: ApiError) -> None:
        if err.status < 500:
            self.server.metrics.count("rejected")
        self._send_json(err.status, err.body())

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None:
            raise ApiError(411, "a Content-Length header is required")
        try:
            n = int(length)
        except ValueError:
            raise ApiError(400, "bad Content-Length header") from None
        if n < 0 or n > self.server.cfg.max_body_bytes:
            self.close_connection = True  # the body stays unread
            raise ApiError(413, f"the request body must be at most {self.server.cfg.max_body_bytes} bytes")
        return self.rfile.read(n)

    def _sse(self, obj: dict | str) -> None:
        payload = obj if isinstance(obj, str) else json.dumps(obj)
        data = f"data: {payload}\n\n".encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")  # one HTTP chunk per event
        self.wfile.flush()

    # ---- routes -------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._send_json(200, {"status": "ok"})
        elif path == "/metrics":
            self._send_text(200, self.server.metrics.render(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/v1/models":
            model = {"id": self.server.model_name, "object": "model", "created": 0, "owned_by": "splitserve",
                     "max_model_len": self.server.engine.max_context}
            self._send_json(200, {"object": "list", "data": [model]})
        else:
            self._send_error(ApiError(404, f"no route GET {path}", kind="not_found_error"))

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._send_error(ApiError(404, f"no route POST {path}", kind="not_found_error"))
            return
        try:
            body = self._read_body()
            with self.server.tokenizer_lock:
                req = parse_request(body, path == "/v1/chat/completions", self.server.tokenizer,
                                    self.server.model_name)
            params = self._params(req)
            job = self.server.worker.submit(req.prompt_ids, params)
        except ApiError as err:
            self._send_error(err)
            return
        except QueueFullError as exc:
            self._send_json(503, ApiError(503, str(exc), kind="server_overloaded").body())
            return
        except Exception as exc:  # a bug in parsing or tokenizing must not take the server down
            log.exception("bad request handling")
            self._send_json(500, ApiError(500, f"{type(exc).__name__}: {exc}", kind="server_error").body())
            return
        reply = Reply(req.chat, self.server.model_name)
        text = TextStream(self.server.tokenizer, req.stop, self.server.tokenizer_lock)
        try:
            if req.stream:
                self._stream(job, req, reply, text)
            else:
                self._complete(job, req, reply, text)
        except DISCONNECTS:
            job.cancel()  # the engine stops at the next round
            self.close_connection = True
            log.info("client disconnected; generation cancelled")

    def _params(self, req: Request) -> SamplingParams:
        engine = self.server.engine
        try:
            max_tokens = req.max_tokens or max(1, engine.max_context - len(req.prompt_ids))
            engine.check_fits(len(req.prompt_ids), max_tokens)
        except ContextLengthError as exc:
            raise ApiError(400, str(exc), "messages" if req.chat else "prompt") from None
        eos = frozenset() if req.ignore_eos else self.server.eos_ids
        return SamplingParams(max_tokens=max_tokens, temperature=req.temperature, seed=req.seed, eos_ids=eos)

    def _client_gone(self) -> bool:
        """True when the peer closed its side (readable, and a peek returns EOF)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _events(self, job: Job, text: TextStream):
        """-> (text delta, None) per round, then ("", (finish_reason, completion tokens)).
        While waiting (queued, or a slow round) it checks the client is still there, so a
        non-streaming client that leaves frees the engine too."""
        count, checked = 0, time.monotonic()
        while True:
            try:
                kind, value = job.events.get(timeout=CLIENT_CHECK_S)
            except queue.Empty:
                kind, value = None, None
            if time.monotonic() - checked >= CLIENT_CHECK_S:
                checked = time.monotonic()
                if self._client_gone():
                    raise ConnectionAbortedError("client closed the connection")
            if kind is None:
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

    def _complete(self, job: Job, req: Request, reply: Reply, text: TextStream) -> None:
        parts, end = [], None
        try:
            for delta, end in self._events(job, text):
                parts.append(delta)
        except ApiError as err:
            self._send_error(err)
            return
        finish, count = end
        self._send_json(200, reply.full("".join(parts), finish, reply.usage(len(req.prompt_ids), count)))

    def _stream(self, job: Job, req: Request, reply: Reply, text: TextStream) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if req.chat:
            self._sse(reply.chunk("", first=True))
        try:
            for delta, end in self._events(job, text):
                if delta:
                    self._sse(reply.chunk(delta))
                if end is not None:
                    finish, count = end
                    self._sse(reply.chunk(None, finish))
                    if req.include_usage:
                        self._sse(reply.usage_chunk(reply.usage(len(req.prompt_ids), count)))
        except ApiError as err:  # headers are out: report in-band, as OpenAI does
            self._sse(err.body())
        self._sse("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def build_server(engine: Engine, tokenizer, eos_ids: frozenset[int], cfg: ServerConfig, model_name: str) -> SplitServer:
    return SplitServer(engine, tokenizer, eos_ids, cfg, model_name)
