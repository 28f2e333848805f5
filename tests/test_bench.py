"""`splitserve bench` on tiny sizes: every method runs, the JSON has the fields, the table prints.
No timing claims: a tiny random model on a shared CPU says nothing about speed."""

import json

import pytest
import torch
from tiny import export_tiny_draft

from splitserve import cli
from splitserve.serve.bench import percentile, summarize, synthetic_prompts


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: on a shared CPU, intra-op thread hand-offs cost more than the work itself."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


FIELDS = ("mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_ttft_ms", "median_ttft_ms", "output_tok_s",
          "num_requests")


@pytest.fixture(scope="module")
def draft_dir(tiny_smol_dir, tmp_path_factory):
    return export_tiny_draft(tiny_smol_dir, tmp_path_factory.mktemp("bench") / "draft")


def test_bench_with_baselines_writes_json(tiny_smol_dir, draft_dir, tmp_path, capsys):
    out = tmp_path / "bench.json"
    cli.main(["bench", "--draft", str(draft_dir), "--target", str(tiny_smol_dir), "--device", "cpu",
              "--input-len", "12", "--output-len", "10", "--num-requests", "3", "--baseline",
              "--assistant", str(tiny_smol_dir), "--json", str(out)])
    report = json.loads(out.read_text())
    res = report["results"]
    assert set(res) == {"engine spec", "engine AR", "transformers generate", "transformers assisted"}
    for name, r in res.items():
        assert r["note"] is None, name
        for key in FIELDS:
            assert r[key] is not None, (name, key)
        assert r["num_requests"] == 3
        assert [q["output_tokens"] for q in r["requests"]] == [10, 10, 10], name  # EOS ignored
    assert res["engine spec"]["mean_accept_length"] >= 1.0
    assert res["engine spec"]["exact_vs_ar"] == 3  # greedy speculative == greedy AR, token for token
    assert report["config"]["input_len"] == 12 and report["block_size"] == 4 and report["cuda_graphs"] is False
    printed = capsys.readouterr().out
    assert "| engine spec |" in printed and "| transformers assisted |" in printed


def test_bench_spec_only_and_missing_assistant_note(tiny_smol_dir, draft_dir, tmp_path):
    from splitserve.serve.bench import run_bench
    from splitserve.serve.config import BenchConfig, EngineConfig, ModelsConfig

    models = ModelsConfig(draft=str(draft_dir), target=str(tiny_smol_dir), device="cpu")
    report = run_bench(models, EngineConfig(), BenchConfig(input_len=6, output_len=5, num_requests=2, warmup=0))
    assert list(report["results"]) == ["engine spec"]
    # --baseline without --assistant: the assisted row is a skip with its reason
    cfg = BenchConfig(input_len=6, output_len=4, num_requests=1, warmup=0, baseline=True,
                      json_out=str(tmp_path / "b.json"))
    report = run_bench(models, EngineConfig(), cfg)
    assert "assistant" in report["results"]["transformers assisted"]["note"]
    assert "skipped" in report["table"]


def test_statistics_helpers():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert percentile(list(map(float, range(101))), 99) == 99.0
    prompts = synthetic_prompts(50, 3, 7, seed=1, avoid={0, 1, 49})
    assert len(prompts) == 3 and all(len(p) == 7 and not {0, 1, 49} & set(p) for p in prompts)
    assert prompts == synthetic_prompts(50, 3, 7, seed=1, avoid={0, 1, 49})
    assert summarize("x", []).output_tok_s is None
