"""`splitserve bench` in the public benchmark's shape (bench_serving --dataset-name random
--max-concurrency 1): the random dataset is reproducible and exactly --input-len long, the
statistics match hand-computed values, and what cannot run is refused in one line before any
weight is read; the server answers a too-long prompt with a 400 naming both lengths."""

import http.client
import json

import pytest
from tiny import export_tiny_draft

from splitserve import cli
from splitserve.evaluation.bench_dataset import SETTLE_TRIES, random_prompts, special_tokens
from splitserve.evaluation.bench_report import (
    MethodResult,
    RequestTiming,
    acceptance,
    format_table,
    itls,
    percentile,
    summarize,
)

pytestmark = pytest.mark.usefixtures("one_thread")


# ---- the random dataset -------------------------------------------------------------------


TURNS = ["Tell me about the sea.", "What is a good name for a cat?", "Hi!", "Why is the sky blue? Be brief.",
         "List three fruits, one per line.", "Translate 'good morning' into French."]


@pytest.mark.parametrize("source", ["uniform", "sequential", "prompt file"])
def test_random_prompts_are_exact_and_reproducible(smollm2_tokenizer, source, tmp_path):
    tok = smollm2_tokenizer
    if source == "prompt file":  # sglang's random: user turns repeated to the length
        source = str(tmp_path / "turns.jsonl")
        rows = [{"messages": [{"role": "user", "content": t}, {"role": "assistant", "content": "ok"}]} for t in TURNS]
        (tmp_path / "turns.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    avoid = {17}  # as the draft's mask token (random ids avoid it; a real text may hold it: '!')
    a = random_prompts(tok, tok.vocab_size, 4, 150, seed=3, source=source, avoid=avoid)
    assert [len(ids) for ids in a.ids] == [150] * 4 and a.unsettled == 0
    assert a.ids == random_prompts(tok, tok.vocab_size, 4, 150, seed=3, source=source, avoid=avoid).ids
    special = set(tok.all_special_ids) | avoid
    for ids, text in zip(a.ids, a.texts):
        assert tok.encode(text, add_special_tokens=False) == ids  # the text a server gets re-encodes to them
        assert not (special if source in ("uniform", "sequential") else set(tok.all_special_ids)) & set(ids)
    assert a.ids != random_prompts(tok, tok.vocab_size, 4, 150, seed=4, source=source, avoid=avoid).ids
    if source.endswith(".jsonl"):
        assert {text.split("?")[0].split("!")[0].split(".")[0] for text in a.texts} <= {
            t.split("?")[0].split("!")[0].split(".")[0] for t in TURNS}


class _CharTokenizer:
    """id i <-> chr(64 + i); BOS (id 1) before every text with special tokens on. `drift`: encode
    shifts every id by one, so no text ever re-encodes to its ids."""

    vocab_size = 40
    all_special_ids = [0, 1]

    def __init__(self, drift: bool = False):
        self.drift = drift

    def encode(self, text, add_special_tokens=True):
        ids = [(ord(c) - 64 + self.drift) % self.vocab_size for c in text]
        return ([1] if add_special_tokens else []) + ids

    def batch_decode(self, batch, **_):
        return ["".join(chr(64 + i) for i in ids) for ids in batch]

    def __call__(self, texts, add_special_tokens=True):
        return {"input_ids": [self.encode(t, add_special_tokens) for t in texts]}


def test_special_tokens_are_added_as_a_server_adds_them():
    tok = _CharTokenizer()
    assert special_tokens(tok) == ([1], [])
    r = random_prompts(tok, 40, 3, 9, seed=0)
    assert all(len(ids) == 9 and ids[0] == 1 and 1 not in ids[1:] for ids in r.ids)
    assert r.special_tokens == [1] and r.unsettled == 0
    from splitserve.errors import UserError

    with pytest.raises(UserError, match="at least 2"):
        random_prompts(tok, 40, 1, 1, seed=0)


def test_a_prompt_that_never_settles_keeps_its_length_and_is_counted():
    r = random_prompts(_CharTokenizer(drift=True), 40, 3, 8, seed=0)
    assert r.unsettled == 3 and all(len(ids) == 8 for ids in r.ids)
    assert SETTLE_TRIES >= 1


def test_without_a_tokenizer_ids_are_drawn_as_they_are():
    r = random_prompts(None, 50, 2, 7, seed=1, source="sequential", avoid={0, 49})
    assert [len(ids) for ids in r.ids] == [7, 7] and not {0, 49} & {i for ids in r.ids for i in ids}
    allowed = [i for i in range(50) if i not in {0, 49}]
    for ids in r.ids:  # consecutive allowed ids, wrapping around
        idx = [allowed.index(i) for i in ids]
        assert all((b - a) % len(allowed) == 1 for a, b in zip(idx, idx[1:]))


# ---- statistics on known inputs -----------------------------------------------------------


def test_itl_spreads_each_step_over_its_tokens():
    # first token at 0.5 s (TTFT); a step of 4 tokens 0.25 s later; one of 1 token 0.5 s after that
    assert itls([0.5, 0.75, 0.75, 0.75, 0.75, 1.25]) == [0.0625] * 4 + [0.5]
    assert itls([0.5]) == [] and itls([]) == []


def test_summary_statistics_on_known_values():
    # exact: values binary floats hold exactly
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile(list(map(float, range(101))), 99) == 99.0
    assert percentile([0.0, 1.0], 99) == 0.99
    # four requests, TTFT 1..4 s, each 3 tokens; TPOT 0.5 / 0.25 / 0.25 / 1.0 s
    reqs = [RequestTiming(float(i + 1), tpot, float(i + 1) + 2 * tpot, 3, itl_s=[tpot, tpot], start_s=10.0 * i,
                          end_s=10.0 * i + 5) for i, tpot in enumerate([0.5, 0.25, 0.25, 1.0])]
    r = summarize("x", reqs)
    assert (r.mean_ttft_ms, r.median_ttft_ms) == (2500.0, 2500.0)
    assert r.p99_ttft_ms == pytest.approx(3970.0)  # 3000 + 0.97 * 1000
    assert (r.mean_tpot_ms, r.median_tpot_ms) == (500.0, 375.0)
    assert r.p99_tpot_ms == pytest.approx(985.0)  # 500 + 0.97 * 500
    assert (r.mean_itl_ms, r.median_itl_ms) == (500.0, 375.0)
    assert r.duration_s == 35.0  # first start (0) to last end (35)
    assert (r.request_throughput, r.output_tok_s) == (4 / 35, 12 / 35)
    assert r.total_output_tokens == 12 and r.mean_accept_length is None


def test_acceptance_by_position():
    # rounds accepting 0, 1, 2 and 4 of γ=4 draft tokens
    tau, rate, per_pos = acceptance([0, 1, 2, 4], 4)
    assert (tau, rate, per_pos) == (2.75, 7 / 16, [0.75, 0.5, 0.25, 0.25])
    reqs = [RequestTiming(0.1, 0.01, 0.2, 4, accept_length=2.0, rounds=2, accepts=[0, 1]),
            RequestTiming(0.1, 0.01, 0.2, 8, accept_length=3.5, rounds=2, accepts=[2, 4])]
    r = summarize("spec", reqs, gamma=4)
    assert (r.mean_accept_length, r.acceptance_rate, r.per_position_acceptance, r.rounds) == (2.75, 7 / 16,
                                                                                              per_pos, 4)


def test_table_puts_spec_and_ar_side_by_side():
    spec = MethodResult("engine spec", num_requests=2, output_tok_s=300.0, mean_tpot_ms=2.0, mean_accept_length=2.5,
                        per_position_acceptance=[0.75, 0.5], exact_vs_ar=2)
    ar = MethodResult("engine AR", num_requests=2, output_tok_s=100.0, mean_tpot_ms=6.0)
    skipped = MethodResult("transformers assisted", note="no --assistant")
    table = format_table({"engine spec": spec, "engine AR": ar, "transformers assisted": skipped})
    rows = table.splitlines()
    assert rows[0] == "| metric | engine spec | engine AR | speedup vs AR |"
    assert "| output tok/s | 300.0 | 100.0 | 3.00x |" in rows  # rates: spec / AR
    assert "| mean TPOT (ms) | 2.000 | 6.000 | 3.00x |" in rows  # times: AR / spec
    assert "| acceptance by position 1..γ | 0.75 0.50 | - | - |" in rows
    assert "| output equal to AR | 2/2 | - | - |" in rows
    assert rows[-1] == "transformers assisted: skipped: no --assistant"
    assert not [r for r in rows if r.startswith("| p99 ITL")]  # rows no method measured are left out


# ---- one-line refusals, before any model work ---------------------------------------------


@pytest.fixture(scope="module")
def draft_dir(tiny_smol_dir, tmp_path_factory):
    return export_tiny_draft(tiny_smol_dir, tmp_path_factory.mktemp("bench_public") / "draft")


def _refusal(argv, monkeypatch) -> str:
    import splitserve.loading

    def no_weights(*_a, **_k):
        raise AssertionError("bench loaded the models before refusing")

    monkeypatch.setattr(splitserve.loading, "load_models", no_weights)
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    msg = str(exc.value.code)
    assert "\n" not in msg and msg.startswith("splitserve bench: "), msg
    return msg


def test_refusals_are_one_line_and_come_first(tiny_smol_dir, draft_dir, monkeypatch):
    base = ["bench", "--draft", str(draft_dir), "--target", str(tiny_smol_dir), "--device", "cpu"]
    msg = _refusal(base + ["--random", "--max-concurrency", "4"], monkeypatch)
    assert "--max-concurrency 4" in msg and "one request at a time" in msg
    # the public shape against a target of 2,048 positions
    msg = _refusal(base + ["--random", "--input-len", "8192", "--output-len", "1024", "--num-requests", "1000"],
                   monkeypatch)
    assert "9216" in msg and "2048" in msg and "--input-len 8192" in msg and "--output-len 1024" in msg
    msg = _refusal(base + ["--random", "--prompts", "chitchat"], monkeypatch)
    assert "--random" in msg and "--prompts" in msg
    msg = _refusal(base + ["--random-source", "no/such.jsonl"], monkeypatch)
    assert "--random-source no/such.jsonl" in msg


def test_a_chat_prompt_longer_than_the_context_is_refused_in_one_line(tiny_smol_dir, draft_dir, tmp_path):
    from splitserve.config import BenchConfig, EngineConfig, ModelsConfig
    from splitserve.errors import UserError
    from splitserve.evaluation.bench import run_bench

    prompts = tmp_path / "long.jsonl"
    prompts.write_text(json.dumps({"prompt": "sea " * 2100}) + "\n")
    models = ModelsConfig(draft=str(draft_dir), target=str(tiny_smol_dir), device="cpu")
    with pytest.raises(UserError) as err:
        run_bench(models, EngineConfig(), BenchConfig(output_len=8, num_requests=1, prompts=str(prompts)))
    msg = str(err.value)
    assert "\n" not in msg and "2048" in msg and "--output-len 8" in msg, msg


# ---- the server ---------------------------------------------------------------------------


def test_server_refuses_a_too_long_prompt_with_both_lengths_and_keeps_serving(tiny_smol_dir, draft_dir):
    from splitserve.config import EngineConfig, ModelsConfig, ServerConfig
    from splitserve.serve.app import make_server

    srv = make_server(ModelsConfig(draft=str(draft_dir), target=str(tiny_smol_dir), device="cpu"),
                      EngineConfig(max_context=64), ServerConfig(port=0, served_model_name="m"))
    srv.start_background()
    try:
        def post(body):
            conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=60)
            conn.request("POST", "/v1/completions", json.dumps({"model": "m", **body}),
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())

        status, body = post({"prompt": list(range(5, 85)), "max_tokens": 4})
        assert status == 400 and "80 tokens" in body["error"]["message"] and "64" in body["error"]["message"]
        status, body = post({"prompt": [5, 6, 7], "max_tokens": 100})
        msg = body["error"]["message"]
        assert status == 400 and "3 tokens" in msg and "100" in msg and "64" in msg, msg
        status, body = post({"prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0})
        assert status == 200 and body["usage"]["completion_tokens"] == 4
    finally:
        srv.close()
