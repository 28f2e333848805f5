"""The console script end to end on a tiny target with SmolLM2's tokenizer: train (Hydra),
evaluate, export, evaluate the export, dump and train from the dump."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "splitserve.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**__import__("os").environ, "WANDB_MODE": "offline"})
    if check and proc.returncode != 0:
        raise AssertionError(f"splitserve {args[0]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def _overrides(tiny_smol_dir, run_dir):
    return [
        f"target.path={tiny_smol_dir}", "target.name=tiny-smol", "target.layer_ids=[0,1,2]",
        "data.train_path=data/sample_chat.jsonl", "data.heldout_prompts=data/sample_prompts.jsonl",
        "draft.num_layers=1", "draft.intermediate_size=32", "draft.markov_rank=4",
        "train.max_steps=3", "train.batch_size=2", "train.anchors_per_seq=4", "train.device=cpu",
        "eval.num_prompts=3", "eval.max_new_tokens=8", f"run_dir={run_dir}",
    ]


def test_train_eval_export_eval(tiny_smol_dir, tmp_path):
    run_dir = tmp_path / "run"
    out = run("train", *_overrides(tiny_smol_dir, run_dir))
    assert "Held-out speculative decoding" in out.stdout
    assert (run_dir / "config.yaml").exists() and (run_dir / "metrics.jsonl").exists()
    report = json.loads((run_dir / "eval.json").read_text())
    assert report["trained"]["exact_matches"] == 3 and "untrained" in report
    assert (run_dir / "eval.md").exists() and (run_dir / "acceptance.png").stat().st_size > 1000

    run("export", str(run_dir), str(tmp_path / "export"), "--target", str(tiny_smol_dir))
    res = run("eval", "--draft", str(tmp_path / "export"), "--target", str(tiny_smol_dir),
              "--prompts", "data/sample_prompts.jsonl", "--max-new-tokens", "6", "--json")
    rep = json.loads(res.stdout[res.stdout.index("{"):])["draft"]
    assert rep["num_prompts"] == 5 and rep["exact_matches"] == 5
    first = rep["results"][0]
    assert first["prompt_ids"] and len(first["tokens"]) <= 6 and first["accepts"]
    assert len(rep["per_position"]) == 8  # draft=dspark_b8 by default

    sampled = run("eval", "--draft", str(run_dir), "--prompts", "data/sample_prompts.jsonl",
                  "--max-new-tokens", "6", "--temperature", "1", "--json")
    assert json.loads(sampled.stdout[sampled.stdout.index("{"):])["draft"]["exact_matches"] is None


def test_dump_then_train_from_dump(tiny_smol_dir, tmp_path):
    dump = tmp_path / "dump"
    run("dump", *_overrides(tiny_smol_dir, tmp_path / "unused"), f"dump.out_dir={dump}")
    manifest = json.loads((dump / "manifest.json").read_text())
    assert manifest["num_samples"] == 5 and manifest["layer_ids"] == [0, 1, 2]
    run("train", *_overrides(tiny_smol_dir, tmp_path / "run"), f"data.dump_dir={dump}", "eval.enabled=false")
    assert (tmp_path / "run" / "checkpoints" / "latest").exists()


def test_malformed_data_names_file_and_line(tiny_smol_dir, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{not json\n')
    proc = run("train", *_overrides(tiny_smol_dir, tmp_path / "run"), f"data.train_path={bad}", check=False)
    assert proc.returncode != 0
    assert "bad.jsonl:2" in proc.stderr + proc.stdout
