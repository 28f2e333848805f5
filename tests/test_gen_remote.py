"""`splitserve gen --endpoint`: at greedy, a live `splitserve serve` gives the in-process path's
rows; against a server that drops connections, answers 500 and stalls at random, every row is
written exactly once; a killed run resumes without a lost or doubled row; refusals are recorded
with their reason."""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from tiny import GEN_ROWS, export_tiny_draft, save_sharp_smol

from splitserve.data.endpoint import ChatReply, EndpointConfig
from splitserve.data.gen import GenConfig, run_gen
from splitserve.data.gen_remote import RemoteOptions, new_tokens, request_seed, run_gen_remote

ROOT = Path(__file__).resolve().parents[1]
ROWS = GEN_ROWS[:4]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _opts(url, **kw):
    ep = {k: kw.pop(k) for k in ("concurrency", "timeout_s", "retries", "backoff_s") if k in kw}
    return RemoteOptions(EndpointConfig([url], **ep), **kw)


# --------------------------------------------------------------------------- a live splitserve serve


@pytest.fixture(scope="module")
def sharp_dir(tmp_path_factory):
    return save_sharp_smol(tmp_path_factory.mktemp("sharp"))


@pytest.fixture(scope="module")
def live_server(sharp_dir, tmp_path_factory):
    from splitserve.config import EngineConfig, ModelsConfig, ServerConfig
    from splitserve.serve.app import make_server

    draft = export_tiny_draft(sharp_dir, tmp_path_factory.mktemp("sharp_draft") / "draft")
    srv = make_server(ModelsConfig(draft=str(draft), target=str(sharp_dir), device="cpu"),
                      EngineConfig(max_context=1024), ServerConfig(port=0, served_model_name="sharp-smol"))
    srv.start_background()
    yield srv
    srv.close()


def test_greedy_rows_equal_the_in_process_rows(sharp_dir, live_server, tmp_path):
    data = _write(tmp_path / "chat.jsonl", ROWS)
    common = dict(data=str(data), max_new_tokens=12, max_length=1024)
    local = run_gen(GenConfig(out=str(tmp_path / "local.jsonl"), target=str(sharp_dir), device="cpu",
                              batch_size=1, **common), progress=False)
    remote = run_gen_remote(GenConfig(out=str(tmp_path / "remote.jsonl"), **common),
                            _opts(live_server.url, concurrency=3), progress=False)
    assert local.written == remote.written == 4 and not remote.failed
    want = {r["gen"]["source_row"]: r for r in _rows(tmp_path / "local.jsonl")}
    got = {r["gen"]["source_row"]: r for r in _rows(tmp_path / "remote.jsonl")}
    assert got.keys() == want.keys()
    for key, row in got.items():
        assert row["messages"] == want[key]["messages"], key  # every reply, every turn
        assert row["gen"]["target"] == "sharp-smol" and row["gen"]["sample"] == 0
        for field in ("new_tokens", "unfinished_turns", "turns"):
            assert row["gen"][field] == want[key]["gen"][field], (key, field)
    assert remote.new_tokens == local.new_tokens


# --------------------------------------------------------------------------- a misbehaving server


class FlakyServer(ThreadingHTTPServer):
    """An OpenAI-shaped chat server whose replies are a function of the request (so a retried
    request gets the same answer), and which, at random, drops the connection, answers 500, or
    stalls past the client's timeout. Prompts containing "REFUSE" get a 400."""

    daemon_threads = True

    def __init__(self, p_drop=0.0, p_500=0.0, p_stall=0.0, stall_s=2.0, delay_s=0.0, seed=0):
        super().__init__(("127.0.0.1", 0), FlakyHandler)
        self.p = (p_drop, p_500, p_stall)
        self.stall_s, self.delay_s = stall_s, delay_s
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.faults = {"drop": 0, "500": 0, "stall": 0}
        self.bodies = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def handle_error(self, request, client_address):
        pass  # the faults are deliberate

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"

    def fault(self):
        with self.lock:
            x = self.rng.random()
            for name, p in zip(("drop", "500", "stall"), self.p):
                if x < p:
                    self.faults[name] += 1
                    return name
                x -= p
        return None

    @staticmethod
    def answer(body):
        last = body["messages"][-1]["content"]
        turn = sum(m["role"] == "assistant" for m in body["messages"])
        return f"echo {last} (turn {turn}, seed {body.get('seed')})"


class FlakyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200, {"object": "list", "data": [{"id": "flaky-model", "object": "model"}]})

    def do_POST(self):
        srv = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        fault = srv.fault()
        if fault == "drop":
            self.close_connection = True
            self.connection.shutdown(2)  # no answer at all
            return
        if fault == "500":
            return self._send(500, {"error": {"message": "injected"}})
        if fault == "stall":
            time.sleep(srv.stall_s)
            self.close_connection = True
            return
        if "REFUSE" in body["messages"][-1]["content"]:
            return self._send(400, {"error": {"message": "this prompt is refused"}})
        time.sleep(srv.delay_s)
        with srv.lock:
            srv.bodies.append(body)
        content = srv.answer(body)
        self._send(200, {"id": "x", "object": "chat.completion", "model": "flaky-model",
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": content}}],
                         "usage": {"prompt_tokens": 10, "completion_tokens": len(content.split())}})


def _many(n):
    rows = []
    for i in range(n):
        if i % 3 == 0:
            rows.append({"id": f"r{i}", "messages": [{"role": "user", "content": f"q{i}"},
                                                     {"role": "assistant", "content": "a"},
                                                     {"role": "user", "content": f"q{i}b"}]})
        else:
            rows.append({"id": f"r{i}", "prompt": f"q{i}"})
    return rows


def _check_exactly_once(out, n, samples=1):
    rows = _rows(out)
    keys = [(r["gen"]["source_row"], r["gen"]["sample"]) for r in rows]
    assert len(keys) == len(set(keys)) == n * samples
    assert set(keys) == {(f"r{i}", k) for i in range(n) for k in range(samples)}
    return rows


def test_every_row_exactly_once_through_drops_500s_and_stalls(tmp_path):
    srv = FlakyServer(p_drop=0.15, p_500=0.15, p_stall=0.08, stall_s=1.0, seed=1)
    data = _write(tmp_path / "chat.jsonl", _many(40))
    out = tmp_path / "out.jsonl"
    cfg = GenConfig(data=str(data), out=str(out), temperature=0.7, seed=3)
    summary = run_gen_remote(cfg, _opts(srv.url, concurrency=6, timeout_s=0.3, retries=12, backoff_s=0.01,
                                        num_samples=2), progress=False)
    assert all(srv.faults[k] > 0 for k in ("drop", "500", "stall")), srv.faults
    assert summary.written == 80 and not summary.failed
    assert summary.retried.get("connection", 0) > 0 and summary.retried.get("http_500", 0) > 0
    assert summary.retried.get("timeout", 0) > 0
    rows = _check_exactly_once(out, 40, samples=2)
    # Each reply is the server's answer to exactly the conversation so far, seeded per request.
    for row in rows:
        g, msgs = row["gen"], row["messages"]
        answers = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        assert len(answers) == g["turns"] == (2 if g["source_row"] in {f"r{i}" for i in range(0, 40, 3)} else 1)
        for t, i in enumerate(answers):
            seed = request_seed(3, g["source_row"], g["sample"], t)
            assert msgs[i]["content"] == FlakyServer.answer({"messages": msgs[:i], "seed": seed})
    assert not (tmp_path / "out.jsonl.failures.jsonl").read_text()
    # A rerun finds everything done and asks nothing.
    asked = len(srv.bodies)
    again = run_gen_remote(cfg, _opts(srv.url, num_samples=2), progress=False)
    assert again.written == 0 and again.already_done == 80 and len(srv.bodies) == asked
    srv.shutdown()


def test_refusals_are_recorded_counted_and_retried_on_rerun(tmp_path):
    srv = FlakyServer()
    rows = _many(6)
    rows[4] = {"id": "r4", "prompt": "please REFUSE this"}
    data = _write(tmp_path / "chat.jsonl", rows)
    out = tmp_path / "out.jsonl"
    cfg = GenConfig(data=str(data), out=str(out))
    summary = run_gen_remote(cfg, _opts(srv.url, concurrency=2), progress=False)
    assert summary.written == 5 and summary.failed == {"http_400": 1}
    failures = _rows(tmp_path / "out.jsonl.failures.jsonl")
    assert [(f["source_row"], f["reason"]) for f in failures] == [("r4", "http_400")]
    assert "this prompt is refused" in failures[0]["detail"]
    assert "1 http_400" in summary.format()
    again = run_gen_remote(cfg, _opts(srv.url), progress=False)  # tried again, refused again
    assert again.written == 0 and again.already_done == 5 and again.failed == {"http_400": 1}
    assert len(_rows(out)) == 5
    srv.shutdown()


def test_greedy_sends_no_sampling_fields_and_passes_template_kwargs(tmp_path):
    srv = FlakyServer()
    data = _write(tmp_path / "chat.jsonl", _many(2))
    run_gen_remote(GenConfig(data=str(data), out=str(tmp_path / "g.jsonl"), max_new_tokens=7),
                   _opts(srv.url, chat_template_kwargs={"enable_thinking": False}), progress=False)
    body = srv.bodies[0]
    assert body["model"] == "flaky-model" and body["max_tokens"] == 7 and body["temperature"] == 0
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert not {"seed", "top_p", "top_k"} & body.keys()
    run_gen_remote(GenConfig(data=str(data), out=str(tmp_path / "s.jsonl"), temperature=1.0, top_p=0.8, top_k=20),
                   _opts(srv.url), progress=False)
    assert {"seed", "top_p", "top_k"} <= srv.bodies[-1].keys() and srv.bodies[-1]["top_k"] == 20
    srv.shutdown()


def test_a_killed_run_resumes_without_loss_or_doubles(tmp_path):
    srv = FlakyServer(delay_s=0.1)
    n = 60
    data = _write(tmp_path / "chat.jsonl", _many(n))
    out = tmp_path / "out.jsonl"
    args = [sys.executable, "-m", "splitserve.cli", "gen", "--data", str(data), "--out", str(out),
            "--endpoint", srv.url, "--concurrency", "2"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and (not out.exists() or len(out.read_bytes().splitlines()) < 8):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = out.read_bytes().count(b"\n")  # whole rows; the kill may have torn one more
    assert 8 <= partial < n, partial
    with open(out, "ab") as f:
        f.write(b'{"messages": [{"role": "user", "con')  # as if killed mid-line
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=True)
    assert "dropping a torn last line" in done.stdout and f"{n - partial} written" in done.stdout
    _check_exactly_once(out, n)
    srv.shutdown()


def test_token_counts_leave_out_the_end_of_turn_token():
    # Servers count the end-of-turn token in usage.completion_tokens; rows count generated text.
    assert new_tokens(ChatReply("hi", None, "stop", 5, 4)) == 3
    assert new_tokens(ChatReply("hi", None, "length", 5, 4)) == 4
    assert new_tokens(ChatReply("", None, "stop", 5, None)) == 0


def test_bad_options_are_refused(tmp_path):
    with pytest.raises(ValueError, match="needs temperature > 0"):
        _opts("http://127.0.0.1:1", num_samples=2).check(GenConfig())
    with pytest.raises(ValueError, match="at least one --endpoint"):
        RemoteOptions(EndpointConfig([])).check(GenConfig())


def test_unreachable_endpoint_is_one_line(tmp_path):
    data = _write(tmp_path / "chat.jsonl", _many(1))
    proc = subprocess.run([sys.executable, "-m", "splitserve.cli", "gen", "--data", str(data), "--out",
                           str(tmp_path / "o.jsonl"), "--endpoint", "http://127.0.0.1:9", "--retries", "1"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("splitserve gen: connection: http://127.0.0.1:9/v1/models")
    assert len(proc.stderr.strip().splitlines()) == 1
