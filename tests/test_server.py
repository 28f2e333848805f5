"""The OpenAI-compatible server, live on a free port, driven by the official `openai` client:
streamed and non-streamed chat and completions equal the target's own greedy output, bad
requests get 4xx and the server keeps serving, a client leaving mid-stream frees the engine,
and a draft made for another target is refused at start. HTTP edges (raw sockets, API key,
refused fields, metrics) are in test_server_http.py."""

import http.client
import json
import re
import socket
import threading
import time

import openai
import pytest
import torch
from tiny import export_tiny_draft, tiny_target

from splitserve import cli
from splitserve.config import EngineConfig, ModelsConfig, ServerConfig, TargetConfig
from splitserve.data.prompts import encode_prompt
from splitserve.serve.app import make_server
from splitserve.speculative.decode import target_decode
from splitserve.target.eos import eos_ids
from splitserve.target.hf import load_hf_target

pytestmark = pytest.mark.usefixtures("one_thread")


MAX_CONTEXT = 1024
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


@pytest.fixture(scope="module")
def draft_dir(tiny_smol_dir, tmp_path_factory):
    return export_tiny_draft(tiny_smol_dir, tmp_path_factory.mktemp("serve") / "draft")


@pytest.fixture(scope="module")
def server(tiny_smol_dir, draft_dir):
    srv = make_server(ModelsConfig(draft=str(draft_dir), target=str(tiny_smol_dir), device="cpu"),
                      EngineConfig(max_context=MAX_CONTEXT), ServerConfig(port=0, served_model_name="tiny-dspark"))
    srv.start_background()
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def reference(tiny_smol_dir):
    """A second copy of the target: the test thread must not share the engine's model."""
    target = load_hf_target(TargetConfig(name="ref", path=str(tiny_smol_dir), layer_ids=[0, 1, 2], device="cpu"))
    eos = set(eos_ids(target))

    def greedy(prompt_ids, max_tokens):
        ids = target_decode(target, prompt_ids, max_tokens, eos_ids=eos)
        finish = "stop" if ids and ids[-1] in eos else "length"
        return ids, target.tokenizer.decode(ids, skip_special_tokens=True), finish

    return target, greedy


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _metric(server, name: str) -> float:
    text = server.metrics.render()
    m = re.search(rf"^splitserve_{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def test_models_health_metrics(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny-dspark"]
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    conn.request("GET", "/health")
    resp = conn.getresponse()
    assert resp.status == 200 and json.loads(resp.read()) == {"status": "ok"}
    conn.request("GET", "/v1/models")  # keep-alive: a second request on the same connection
    assert json.loads(conn.getresponse().read())["data"][0]["max_model_len"] == MAX_CONTEXT
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    for name in ("splitserve_requests_total", "splitserve_generation_tokens_total", "splitserve_mean_accept_length",
                 "vllm:time_per_output_token_seconds_sum", "vllm:time_to_first_token_seconds_count",
                 "vllm:num_requests_running", "vllm:spec_decode_num_drafts_total"):
        assert name in text, name


def test_chat_stream_and_full_equal_target_greedy(server, client, reference):
    target, greedy = reference
    ids, text, finish = greedy(encode_prompt(target.tokenizer, MESSAGES), 40)
    before = _metric(server, "spec_rounds_total")
    stream = client.chat.completions.create(model="tiny-dspark", messages=MESSAGES, max_tokens=40, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert streamed == text and finishes == [finish]
    assert chunks[-1].usage.completion_tokens == len(ids)
    assert _metric(server, "spec_rounds_total") > before

    full = client.chat.completions.create(model="tiny-dspark", messages=MESSAGES, max_tokens=40, temperature=0)
    assert full.choices[0].message.content == text and full.choices[0].finish_reason == finish
    assert full.usage.completion_tokens == len(ids)
    assert full.usage.prompt_tokens == len(encode_prompt(target.tokenizer, MESSAGES))


def test_completions_stream_and_full(client, reference):
    target, greedy = reference
    prompt = "The quick brown fox"
    ids, text, finish = greedy(list(target.tokenizer(prompt)["input_ids"]), 24)
    full = client.completions.create(model="tiny-dspark", prompt=prompt, max_tokens=24, temperature=0)
    assert full.choices[0].text == text and full.choices[0].finish_reason == finish
    assert full.usage.completion_tokens == len(ids)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny-dspark", prompt=prompt, max_tokens=24, temperature=0, stream=True) if c.choices)
    assert streamed == text
    # token-id prompts, ignore_eos (vLLM's extension) and sampling run too
    res = client.completions.create(model="tiny-dspark", prompt=[5, 6, 7, 8], max_tokens=30, temperature=1.0, seed=3,
                                    extra_body={"ignore_eos": True})
    assert res.usage.completion_tokens == 30 and res.choices[0].finish_reason == "length"


def test_top_k_top_p_requests(client, reference):
    """Greedy stays the target's greedy output whatever top_k / top_p say; sampled requests
    with them run, and a seed makes them repeat. (Their distribution is tested in
    test_verify.py and test_serve_engine.py with hand-set logits.)"""
    target, greedy = reference
    prompt = "The quick brown fox"
    _, text, _ = greedy(list(target.tokenizer(prompt)["input_ids"]), 16)
    res = client.completions.create(model="tiny-dspark", prompt=prompt, max_tokens=16, temperature=0, top_p=0.3,
                                    extra_body={"top_k": 3})
    assert res.choices[0].text == text
    sampled = [client.completions.create(model="tiny-dspark", prompt=prompt, max_tokens=12, temperature=1.0,
                                         top_p=0.9, seed=11, extra_body={"top_k": 20, "ignore_eos": True})
               for _ in range(2)]
    assert sampled[0].usage.completion_tokens == 12 and sampled[0].choices[0].text == sampled[1].choices[0].text


def test_stop_string_ends_the_reply(client, reference):
    _, greedy = reference
    target, _ = reference
    prompt = "The quick brown fox"
    _, text, _ = greedy(list(target.tokenizer(prompt)["input_ids"]), 24)
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    if not stop.strip():
        pytest.skip("no usable stop string in this model's output")
    res = client.completions.create(model="tiny-dspark", prompt=prompt, max_tokens=24, temperature=0, stop=[stop])
    assert res.choices[0].text == text[: text.index(stop)] and res.choices[0].finish_reason == "stop"


def _still_serves(client):
    res = client.completions.create(model="tiny-dspark", prompt="hi", max_tokens=2, temperature=0)
    assert res.usage.completion_tokens >= 1


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"max_tokens": -1}, openai.BadRequestError, "max_tokens"),
        ({"temperature": 3.0}, openai.BadRequestError, "temperature"),
        ({"top_p": 0.0}, openai.BadRequestError, "top_p"),
        ({"n": 2}, openai.BadRequestError, "'n'.*batch 1"),
        ({"extra_body": {"logit_bias": {"5": -100}}}, openai.BadRequestError, "logit_bias"),
        ({"prompt": list(range(5, 5 + MAX_CONTEXT))}, openai.BadRequestError, str(MAX_CONTEXT)),
        ({"prompt": [1, 2, 3], "max_tokens": MAX_CONTEXT}, openai.BadRequestError, "exceeds"),
        ({"prompt": None}, openai.BadRequestError, "prompt"),
    ],
)
def test_bad_completion_requests_are_4xx(client, kwargs, error, match):
    """Schema errors, the policy's refusals and context limits are all 400, as vLLM answers them."""
    args = {"model": "tiny-dspark", "prompt": "hello", "max_tokens": 4}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        client.completions.create(**args)
    _still_serves(client)


def test_bad_chat_requests(client):
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="tiny-dspark", messages=[], max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="role"):
        client.chat.completions.create(model="tiny-dspark", messages=[{"role": "wizard", "content": "x"}])
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-9", messages=MESSAGES, max_tokens=4)
    _still_serves(client)


def _raw(server, method, path, body: bytes | None = None, headers=None):
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=60)
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    return resp.status, resp.read()


def test_raw_protocol_errors(server, client):
    status, body = _raw(server, "POST", "/v1/completions", b"{not json", {"Content-Type": "application/json"})
    assert status == 400 and "JSON" in json.loads(body)["error"]["message"]
    status, _ = _raw(server, "POST", "/v1/completions", b"[1, 2]", {"Content-Type": "application/json"})
    assert status == 400
    status, _ = _raw(server, "GET", "/v1/nothing")
    assert status == 404
    assert _metric(server, 'requests_total{outcome="rejected"}') >= 3
    _still_serves(client)


def test_concurrent_clients_are_queued(server, reference):
    target, greedy = reference
    prompts = ["one", "two two", "three three three"]
    want = {p: greedy(list(target.tokenizer(p)["input_ids"]), 16)[1] for p in prompts}
    got = {}

    def ask(p):
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        got[p] = c.completions.create(model="tiny-dspark", prompt=p, max_tokens=16, temperature=0).choices[0].text

    threads = [threading.Thread(target=ask, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == want


def test_client_disconnect_mid_stream_frees_the_engine(server, client):
    cancelled = _metric(server, 'requests_total{outcome="cancelled"}')
    tokens_before = _metric(server, "generation_tokens_total")
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=60)
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": MAX_CONTEXT - 16, "temperature": 0,
                       "stream": True, "ignore_eos": True})
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    for _ in range(3):  # a few events arrive, then the client goes away
        assert resp.fp.readline()
    conn.sock.close()
    resp.close()
    deadline = time.monotonic() + 120  # a bound for a stuck test, not a timing claim
    while _metric(server, 'requests_total{outcome="cancelled"}') == cancelled:
        assert time.monotonic() < deadline, "the generation was not cancelled"
        time.sleep(0.05)
    assert _metric(server, "generation_tokens_total") - tokens_before < MAX_CONTEXT - 16
    assert _metric(server, "requests_running") == 0
    _still_serves(client)


def test_draft_for_another_target_is_refused_at_start(draft_dir, tmp_path):
    other = tiny_target(seed=2, hidden=64)
    other_dir = tmp_path / "other"
    other.model.save_pretrained(other_dir)
    with pytest.raises(SystemExit, match="refusing to start.*hidden size 32 vs target 64"):
        cli.main(["serve", "--draft", str(draft_dir), "--target", str(other_dir), "--device", "cpu", "--port", "0"])


def test_incremental_detokenization_matches_full_decode(smollm2_tokenizer):
    """Random ids (byte tokens that split UTF-8 characters included) pushed in random chunks:
    the deltas add up to the full decode, and a stop string cuts exactly where it starts."""
    from splitserve.serve.detok import TextStream

    tok = smollm2_tokenizer
    g = torch.Generator().manual_seed(0)
    emoji = tok("héllo wörld 🙂 ✓ 日本語", add_special_tokens=False)["input_ids"]
    for trial in range(20):
        ids = torch.randint(0, len(tok), (40,), generator=g).tolist() + emoji
        stream, out, i = TextStream(tok), [], 0
        while i < len(ids):
            k = int(torch.randint(1, 6, (1,), generator=g))
            out.append(stream.push(ids[i : i + k]))
            i += k
        out.append(stream.finish())
        assert "".join(out) == tok.decode(ids, skip_special_tokens=True), trial
    full = tok.decode(emoji)
    stream = TextStream(tok, stop=["wörld"])
    text = "".join(stream.push([t]) for t in emoji) + stream.finish()
    assert text == full[: full.index("wörld")] and stream.stopped


def test_client_leaving_a_non_streaming_request_frees_the_engine(server, client):
    cancelled = _metric(server, 'requests_total{outcome="cancelled"}')
    sock = socket.create_connection(server.server_address[:2], timeout=60)
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": MAX_CONTEXT - 16, "temperature": 0,
                       "ignore_eos": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    deadline = time.monotonic() + 120  # bounds for a stuck test, not timing claims
    while _metric(server, "requests_running") == 0:
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.02)
    sock.close()
    while _metric(server, 'requests_total{outcome="cancelled"}') == cancelled:
        assert time.monotonic() < deadline, "the generation was not cancelled"
        time.sleep(0.05)
    _still_serves(client)
