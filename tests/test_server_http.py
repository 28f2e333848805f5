"""The server's HTTP edges on a live server (tiny target + tiny draft, CPU), through raw sockets
and the `openai` client: stalled bodies time out, wrong methods and routes get JSON 405 / 404,
oversized bodies 413, the API key is enforced, unknown and refused fields are a 400 naming
them, --chat-template and chat_template_kwargs reach the template, and /metrics carries vLLM's
names with the errors counted. After every bad request the server still serves."""

import json
import re
import socket

import openai
import pytest
from tiny import export_tiny_draft

from splitserve.config import EngineConfig, ModelsConfig, ServerConfig
from splitserve.serve.app import make_server
from splitserve.serve.metrics import Metrics
from splitserve.speculative.engine import GenStats

pytestmark = pytest.mark.usefixtures("one_thread")

KEY = "sekret"
MODEL = "tiny-dspark"
MAX_BODY = 64 << 10
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if shout %}!!!{% endif %}<a>"


@pytest.fixture(scope="module")
def draft_dir(tiny_smol_dir, tmp_path_factory):
    return export_tiny_draft(tiny_smol_dir, tmp_path_factory.mktemp("serve_http") / "draft")


@pytest.fixture(scope="module")
def server(tiny_smol_dir, draft_dir, tmp_path_factory):
    template = tmp_path_factory.mktemp("template") / "chat.jinja"
    template.write_text(TEMPLATE)
    cfg = ServerConfig(port=0, served_model_name=MODEL, api_key=KEY, chat_template=str(template),
                       max_body_bytes=MAX_BODY, request_timeout_s=1.0, ignore_fields=("x_trace",))
    srv = make_server(ModelsConfig(draft=str(draft_dir), target=str(tiny_smol_dir), device="cpu"),
                      EngineConfig(max_context=256), cfg)
    srv.start_background()
    yield srv
    srv.close()


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def _still_serves(client):
    res = client.completions.create(model=MODEL, prompt="hi", max_tokens=2, temperature=0)
    assert res.usage.completion_tokens >= 1


def _raw(server, request: bytes, wait_s: float = 30.0) -> tuple[int, dict, bytes]:
    """Send raw bytes, read until the server closes or a full response is in -> (status, headers, body)."""
    sock = socket.create_connection(server.server_address, timeout=wait_s)
    sock.sendall(request)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length: (\d+)", head)
            if sep and length and len(body) >= int(length.group(1)):
                break
    finally:
        sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def _req(method: str, path: str, body: bytes = b"", headers: str = "", auth: bool = True) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if auth:
        head += f"Authorization: Bearer {KEY}\r\n"
    if body and "Content-Length" not in headers:
        head += f"Content-Length: {len(body)}\r\n"
    return (head + headers + "\r\n").encode() + body


def _metric(server, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", server.metrics.render(), re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def test_short_body_times_out_instead_of_holding_the_connection(server, client):
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    request = _req("POST", "/v1/completions", body[:10], headers=f"Content-Length: {len(body)}\r\n")
    # wait_s bounds a hung test; the server's own limit (1 s) is what answers
    status, headers, payload = _raw(server, request, wait_s=30)
    assert status == 408 and "did not arrive" in json.loads(payload)["error"]["message"]
    assert headers.get("connection") == "close"
    _still_serves(client)


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_wrong_method_is_a_json_405(server, client, method):
    status, headers, payload = _raw(server, _req(method, "/v1/completions"))
    assert status == 405 and json.loads(payload)["error"]["code"] == 405
    assert "POST" in headers.get("allow", "")
    _still_serves(client)


def test_unknown_route_is_a_json_404(server, client):
    status, _, payload = _raw(server, _req("GET", "/v1/nothing"))
    assert status == 404 and "no route GET /v1/nothing" in json.loads(payload)["error"]["message"]
    _still_serves(client)


def test_oversized_bodies_are_413(server, client):
    status, _, payload = _raw(server, _req("POST", "/v1/completions", b"", headers="Content-Length: 10000000\r\n"))
    assert status == 413 and str(MAX_BODY) in json.loads(payload)["error"]["message"]
    chunk = b"x" * (MAX_BODY // 2)  # chunked: no length up front, the count crosses the limit
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(3)) + b"0\r\n\r\n"
    status, _, _ = _raw(server, _req("POST", "/v1/completions", b"", headers="Transfer-Encoding: chunked\r\n")
                        + chunked)
    assert status == 413
    status, _, _ = _raw(server, _req("POST", "/v1/completions", b"{}", headers="Content-Length: -1\r\n"))
    assert status == 400  # uvicorn refuses the malformed header itself
    _still_serves(client)


def test_api_key_is_required_on_v1_only(server, client):
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    status, headers, payload = _raw(server, _req("POST", "/v1/completions", body, auth=False))
    assert status == 401 and json.loads(payload)["error"]["type"] == "authentication_error"
    assert headers.get("www-authenticate") == "Bearer"
    wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    for path in ("/health", "/metrics"):  # probes and scrapers need no key (as vLLM)
        assert _raw(server, _req("GET", path, auth=False))[0] == 200
    _still_serves(client)


@pytest.mark.parametrize("field, value", [
    ("logit_bias", {"5": -100}), ("response_format", {"type": "json_object"}), ("tool_choice", "auto"),
    ("repetition_penalty", 1.2), ("min_tokens", 3), ("presence_penalty", 0.5), ("logprobs", 2),
])
def test_refused_fields_are_400_naming_them(client, field, value):
    with pytest.raises(openai.BadRequestError, match=f"unsupported field '{field}'"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body={field: value})
    _still_serves(client)


def test_unknown_fields_are_400_naming_them_and_neutral_values_pass(client):
    with pytest.raises(openai.BadRequestError, match="unknown fields 'temprature', 'foo'"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body={"temprature": 0, "foo": 1})
    # neutral values of refused fields change nothing, harmless metadata and --ignore-field pass
    res = client.completions.create(model=MODEL, prompt="hi", max_tokens=2, temperature=0, n=1, presence_penalty=0,
                                    user="u1", extra_body={"logit_bias": {}, "repetition_penalty": 1.0,
                                                           "x_trace": "abc"})
    assert res.usage.completion_tokens >= 1


def test_validation_errors_are_json_400_naming_the_field(server, client):
    body = json.dumps({"messages": [{"role": "user", "content": 5}], "max_tokens": "many"}).encode()
    status, _, payload = _raw(server, _req("POST", "/v1/chat/completions", body))
    err = json.loads(payload)["error"]
    assert status == 400 and "max_tokens" in err["message"] and "messages.0.content" in err["message"]
    _still_serves(client)


def test_chat_template_file_and_kwargs_reach_the_template(server, client):
    tok = server.tokenizer
    messages = [{"role": "user", "content": "hello there"}]
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, temperature=0)
    assert plain.usage.prompt_tokens == len(tok("<user>hello there<a>", add_special_tokens=False)["input_ids"])
    shout = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, temperature=0,
                                           extra_body={"chat_template_kwargs": {"shout": True}})
    assert shout.usage.prompt_tokens == len(tok("<user>hello there!!!<a>", add_special_tokens=False)["input_ids"])
    # text content parts reach the template joined by a newline, as vLLM joins them (and as
    # training data reads them: data/formats.py)
    parts = [{"role": "user", "content": [{"type": "text", "text": t} for t in ("ab", "cd", "ef", "gh")]}]
    joined = client.chat.completions.create(model=MODEL, messages=parts, max_tokens=2, temperature=0)
    assert joined.usage.prompt_tokens == len(tok("<user>ab\ncd\nef\ngh<a>", add_special_tokens=False)["input_ids"])
    assert joined.usage.prompt_tokens != len(tok("<user>abcdefgh<a>", add_special_tokens=False)["input_ids"])


def _post(server, path: str, obj, content_type: str | None = "application/json") -> tuple[int, dict, dict]:
    """A JSON body sent as is (json.dumps keeps a lone surrogate as its \\ud800 escape)."""
    body = json.dumps(obj).encode() if not isinstance(obj, bytes) else obj
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n"
    if content_type is not None:
        head += f"Content-Type: {content_type}\r\n"
    status, headers, payload = _raw(server, (head + "\r\n").encode() + body)
    return status, headers, json.loads(payload)


def test_null_optional_fields_mean_their_defaults(server, client):
    # clients that send every optional field send null for the unset ones
    nulls = {"temperature": None, "top_p": None, "top_k": None, "stream": None, "ignore_eos": None, "seed": None,
             "stop": None, "stream_options": None, "max_completion_tokens": None, "n": None}
    status, _, reply = _post(server, "/v1/chat/completions",
                             {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                              **nulls})
    assert status == 200 and reply["usage"]["completion_tokens"] >= 1


def test_a_reply_object_sent_back_as_history_is_served(client):
    first = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                           temperature=0)
    history = [{"role": "user", "content": "hi"}, first.choices[0].message.model_dump(),
               {"role": "user", "content": "and?"}]
    assert {"refusal", "tool_calls", "annotations"} <= set(history[1])  # what the client's object carries
    again = client.chat.completions.create(model=MODEL, messages=history, max_tokens=2, temperature=0)
    assert again.usage.completion_tokens >= 1
    tool_turn = [*history[:2], {"role": "tool", "content": "42", "tool_call_id": "call_1"},
                 {"role": "user", "content": "so?"}]
    assert client.chat.completions.create(model=MODEL, messages=tool_turn, max_tokens=2).usage.completion_tokens >= 1
    called = [{"role": "user", "content": "hi"},
              {"role": "assistant", "content": None,
               "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
              {"role": "user", "content": "so?"}]
    with pytest.raises(openai.BadRequestError, match="messages.1: unsupported field 'tool_calls'"):
        client.chat.completions.create(model=MODEL, messages=called, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="messages.0: unknown field 'colour'"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x", "colour": "red"}],
                                       max_tokens=2)
    _still_serves(client)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "a\udc80b", "max_tokens": 2}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}], "max_tokens": 2},
     "messages.0.content"),
    ("/v1/completions", {"prompt": "ab", "max_tokens": 2, "model": "\ud800"}, "model"),
    ("/v1/completions", {"prompt": "ab", "max_tokens": 2, "seed": 2**70}, "seed"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                              "chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs"),
])
def test_input_no_tokenizer_or_generator_takes_is_a_400_naming_the_field(server, client, path, body, param):
    status, _, reply = _post(server, path, body)
    assert status == 400 and reply["error"]["param"] == param, reply
    _still_serves(client)


def test_a_tiny_temperature_or_top_p_decodes_greedily(client):
    greedy = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=8, temperature=0,
                                       extra_body={"ignore_eos": True}).choices[0].text
    for kwargs in ({"temperature": 5e-324}, {"temperature": 1.0, "top_p": 1e-300}):
        res = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=8, seed=3,
                                        extra_body={"ignore_eos": True}, **kwargs)
        assert res.choices[0].text == greedy, kwargs


def test_body_media_type_json_errors_and_the_smaller_routes(server, client):
    body = {"prompt": "hi", "max_tokens": 2, "temperature": 0}
    status, _, reply = _post(server, "/v1/completions", b"prompt=hi", "application/x-www-form-urlencoded")
    assert status == 415 and "application/json" in reply["error"]["message"]
    assert _post(server, "/v1/completions", body, None)[0] == 200  # no Content-Type: taken as JSON
    assert _post(server, "/v1/completions", body, "application/json; charset=utf-8")[0] == 200
    status, _, reply = _post(server, "/v1/completions", b'{"prompt": ')
    assert status == 400 and reply["error"]["param"] is None and "not valid JSON" in reply["error"]["message"]
    assert _post(server, "/v1/completions", {**body, "parallel_tool_calls": True})[0] == 200  # OpenAI's default
    assert _raw(server, _req("HEAD", "/health"))[0] == 200
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")
    _still_serves(client)


def test_metrics_use_vllm_names_and_count_errors(server, client):
    before_404 = _metric(server, 'splitserve_http_errors_total{status="404"}')
    before_ttft = _metric(server, f'vllm:time_to_first_token_seconds_count{{model_name="{MODEL}"}}')
    _raw(server, _req("GET", "/v1/nothing"))
    client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0,
                              extra_body={"ignore_eos": True})
    text = server.metrics.render()
    assert _metric(server, 'splitserve_http_errors_total{status="404"}') == before_404 + 1
    assert _metric(server, f'vllm:time_to_first_token_seconds_count{{model_name="{MODEL}"}}') == before_ttft + 1
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:inter_token_latency_seconds_bucket",
                 "vllm:time_per_output_token_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
                 "vllm:request_queue_time_seconds_bucket", 'vllm:request_success_total{finished_reason="length"',
                 "vllm:spec_decode_num_draft_tokens_total"):
        assert name in text, name
    label = f'{{model_name="{MODEL}"}}'
    drafts = _metric(server, f"vllm:spec_decode_num_drafts_total{label}")
    accepted = _metric(server, f"vllm:spec_decode_num_accepted_tokens_total{label}")
    per_pos = [float(v) for v in re.findall(r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{.*\} (\S+)$',
                                            text, re.MULTILINE)]
    assert drafts > 0 and _metric(server, f"vllm:spec_decode_num_draft_tokens_total{label}") == drafts * 4
    assert len(per_pos) == 4 and sum(per_pos) == accepted and per_pos == sorted(per_pos, reverse=True)


def test_ttft_and_e2e_include_queue_time():
    """Synthetic stats: TTFT = queue + the engine's own TTFT, e2e = queue + last token."""
    m = Metrics("m", gamma=2)
    stats = GenStats(prompt_tokens=3, tokens=[1, 2, 3], accepts=[1, 0], finish_reason="stop", ttft_s=0.25,
                     token_times=[0.25, 0.5, 0.75], total_s=0.75)
    m.observe(stats, queue_s=2.0)
    text = m.render()

    def value(name):
        return float(re.search(rf'^{re.escape(name)}{{model_name="m"}} (\S+)$', text, re.MULTILINE).group(1))

    assert value("vllm:time_to_first_token_seconds_sum") == pytest.approx(2.25)
    assert value("vllm:e2e_request_latency_seconds_sum") == pytest.approx(2.75)
    assert value("vllm:request_queue_time_seconds_sum") == pytest.approx(2.0)
    assert value("vllm:inter_token_latency_seconds_count") == 2
    assert value("vllm:spec_decode_num_accepted_tokens_total") == 1


def test_port_in_use_is_refused_before_loading(draft_dir, tmp_path):
    from splitserve.errors import UserError

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        port = busy.getsockname()[1]
        # a target path that does not exist: reaching the loader would be another error
        with pytest.raises(UserError, match=f"--port {port}"):
            make_server(ModelsConfig(draft=str(draft_dir), target=str(tmp_path / "missing"), device="cpu"),
                        EngineConfig(max_context=64), ServerConfig(port=port))
    finally:
        busy.close()
