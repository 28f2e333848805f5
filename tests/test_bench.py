"""`splitserve bench` on tiny sizes: every method runs, the JSON and Markdown have the fields, the
table prints. No timing claims: a tiny random model on a shared CPU says nothing about speed.
The random dataset, the statistics on known inputs and the one-line refusals: test_bench_public.py."""

import json

import pytest
from tiny import export_tiny_draft

from splitserve import cli
from splitserve.evaluation.bench import RequestTiming, percentile, summarize, synthetic_prompts

pytestmark = pytest.mark.usefixtures("one_thread")


FIELDS = ("num_requests", "duration_s", "request_throughput", "output_tok_s", "total_input_tokens",
          "total_output_tokens", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
          "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2e_ms", "median_e2e_ms", "p99_e2e_ms")
SPEC_FIELDS = ("mean_accept_length", "acceptance_rate", "per_position_acceptance", "rounds", "exact_vs_ar")


@pytest.fixture(scope="module")
def draft_dir(tiny_smol_dir, tmp_path_factory):
    return export_tiny_draft(tiny_smol_dir, tmp_path_factory.mktemp("bench") / "draft")


def test_bench_with_baselines_writes_json_and_markdown(tiny_smol_dir, draft_dir, tmp_path, capsys):
    out = tmp_path / "res" / "bench.json"
    cli.main(["bench", "--draft", str(draft_dir), "--target", str(tiny_smol_dir), "--device", "cpu", "--random",
              "--input-len", "12", "--output-len", "10", "--num-requests", "3", "--max-concurrency", "1",
              "--baseline", "--hf-baselines", "--assistant", str(tiny_smol_dir), "--result-file", str(out)])
    report = json.loads(out.read_text())
    res = report["results"]
    assert set(res) == {"engine spec", "engine AR", "transformers generate", "transformers assisted"}
    for name, r in res.items():
        assert r["note"] is None, name
        for key in FIELDS:
            assert r[key] is not None, (name, key)
        assert r["num_requests"] == 3 and r["total_input_tokens"] == 36 and r["total_output_tokens"] == 30
        assert [q["output_tokens"] for q in r["requests"]] == [10, 10, 10], name  # EOS ignored
    spec = res["engine spec"]
    for key in SPEC_FIELDS:
        assert spec[key] is not None, key
    assert spec["mean_accept_length"] >= 1.0 and len(spec["per_position_acceptance"]) == 4
    assert spec["exact_vs_ar"] == 3  # greedy speculative == greedy AR, token for token
    assert res["engine AR"]["mean_accept_length"] is None
    assert report["config"]["input_len"] == 12 and report["block_size"] == 4 and report["cuda_graphs"] is False
    assert report["dataset"]["name"] == "random" and report["dataset"]["unsettled"] == 0
    printed = capsys.readouterr().out
    table = report["table"]
    assert table in printed and table in out.with_suffix(".md").read_text()
    header = table.splitlines()[0]
    assert header == ("| metric | engine spec | engine AR | transformers generate | transformers assisted "
                      "| speedup vs AR |")
    for label in ("duration (s)", "request throughput (req/s)", "output tok/s", "p99 TTFT (ms)", "median TPOT (ms)",
                  "p99 ITL (ms)", "accept length τ", "acceptance by position 1..γ", "output equal to AR"):
        assert f"| {label} |" in table, label
    speedup = next(row for row in table.splitlines() if row.startswith("| output tok/s |")).split("|")[-2]
    assert speedup.strip().endswith("x")


def test_bench_spec_only_and_missing_assistant_note(tiny_smol_dir, draft_dir, tmp_path):
    from splitserve.config import BenchConfig, EngineConfig, ModelsConfig
    from splitserve.evaluation.bench import run_bench

    models = ModelsConfig(draft=str(draft_dir), target=str(tiny_smol_dir), device="cpu")
    report = run_bench(models, EngineConfig(), BenchConfig(input_len=6, output_len=5, num_requests=2, warmup=0))
    assert list(report["results"]) == ["engine spec"]
    assert "speedup vs AR" not in report["table"]
    # --baseline is the engine's AR mode alone; --hf-baselines without --assistant: the assisted
    # row is a skip with its reason
    cfg = BenchConfig(input_len=6, output_len=4, num_requests=1, warmup=0, baseline=True)
    assert list(run_bench(models, EngineConfig(), cfg)["results"]) == ["engine spec", "engine AR"]
    cfg = BenchConfig(input_len=6, output_len=4, num_requests=1, warmup=0, hf_baselines=True,
                      result_file=str(tmp_path / "b.json"))
    report = run_bench(models, EngineConfig(), cfg)
    assert "assistant" in report["results"]["transformers assisted"]["note"]
    assert "skipped" in report["table"] and "skipped" in (tmp_path / "b.md").read_text()


def test_statistics_helpers():
    # exact: Python float arithmetic on values that binary floats hold exactly
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert percentile(list(map(float, range(101))), 99) == 99.0
    prompts = synthetic_prompts(50, 3, 7, seed=1, avoid={0, 1, 49})
    assert len(prompts) == 3 and all(len(p) == 7 and not {0, 1, 49} & set(p) for p in prompts)
    assert prompts == synthetic_prompts(50, 3, 7, seed=1, avoid={0, 1, 49})
    assert summarize("x", []).output_tok_s is None
    # τ pools rounds over requests: a 1-round request with τ 9 does not outweigh 10 rounds at τ 1
    reqs = [RequestTiming(0.1, 0.01, 0.2, 9, accept_length=9.0, rounds=1),
            RequestTiming(0.1, 0.01, 0.2, 10, accept_length=1.0, rounds=10)]
    assert summarize("spec", reqs).mean_accept_length == pytest.approx(19 / 11)


def test_bench_on_chat_prompts(tiny_smol_dir, draft_dir, tmp_path):
    """--prompts: chat prompts in the target's template, replies cut at EOS or output_len."""
    from splitserve.config import BenchConfig, EngineConfig, ModelsConfig
    from splitserve.evaluation.bench import run_bench

    prompts = tmp_path / "prompts.jsonl"
    rows = [{"messages": [{"role": "user", "content": text}]} for text in ("Hi there!", "How was your day?", "Hm.")]
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    models = ModelsConfig(draft=str(draft_dir), target=str(tiny_smol_dir), device="cpu")
    cfg = BenchConfig(output_len=7, num_requests=2, warmup=0, baseline=True, hf_baselines=True, prompts=str(prompts))
    report = run_bench(models, EngineConfig(), cfg)
    res = report["results"]
    assert res["engine spec"]["num_requests"] == 2  # num_requests caps the prompt set
    assert res["engine spec"]["exact_vs_ar"] == 2
    for name in ("engine spec", "engine AR", "transformers generate"):
        assert all(1 <= q["output_tokens"] <= 7 for q in res[name]["requests"]), name
    # every method produced the same greedy reply lengths (EOS honoured alike)
    lengths = {name: [q["output_tokens"] for q in res[name]["requests"]] for name in res if res[name]["note"] is None}
    assert len({tuple(v) for v in lengths.values()}) == 1, lengths
    assert report["config"]["prompts"] == str(prompts)
