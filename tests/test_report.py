"""`splitserve report` on hand-made run directories: complete, crashed and stopped runs, no training."""

import json
import os

import pytest

from splitserve.cli import main
from splitserve.evaluation.report import read_sweep, write_report


def _eval_entry(tau, temperature, per_position):
    return {"tau": tau, "per_position": per_position, "rounds": 10, "tokens": 20, "num_prompts": 2,
            "temperature": temperature, "block_size": len(per_position), "exact_matches": None, "results": []}


def _run(root, name, *, draft="dspark_b8", gamma=4, steps=40, finished=True, evaluated=True, checkpoint=True):
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(f"- draft={draft}\n- train.max_steps={steps}\n")
    (d / "config.yaml").write_text(
        f"draft:\n  name: {draft}\n  block_size: {gamma}\n  markov_rank: 8\n  num_layers: 2\n"
        "loss:\n  name: paper\n  kind: paper\neval:\n  enabled: true\n")
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "alpha": 0.1 * s, "tokens_seen": 100 * s}) + "\n"
                                             for s in (1, 2, 3)))
    if checkpoint:
        ck = d / "checkpoints" / f"step_{steps:07d}"
        ck.mkdir(parents=True)
        (ck / "state.json").write_text(json.dumps({"step": steps, "tokens_seen": 1000 * steps, "elapsed_s": 150.0,
                                                   "finished": finished}))
        (d / "checkpoints" / "latest").write_text(ck.name)
    if evaluated:
        (d / "eval.json").write_text(json.dumps({
            "trained": _eval_entry(1.8, 0.0, [0.6, 0.5, 0.3, 0.1][:gamma]),
            "untrained": _eval_entry(1.0, 0.0, [0.0] * gamma),
            "trained@T=1": _eval_entry(1.6, 1.0, [0.5, 0.4, 0.2, 0.1][:gamma]),
        }))
        (d / "calibration.json").write_text(json.dumps({"fits": [{"ece_before": 0.071, "ece_after": 0.012}]}))
    return d


@pytest.fixture()
def sweep(tmp_path):
    root = tmp_path / "sweep"
    _run(root, "0_draft=dspark_b8")
    _run(root, "1_draft=dflash_b8", draft="dflash_b8", steps=80)
    _run(root, "2_draft=dspark_b16", draft="dspark_b16", gamma=4, checkpoint=False, evaluated=False)  # crashed
    _run(root, "3_draft=dspark_b4", draft="dspark_b4", finished=False, evaluated=False)  # killed mid-run
    (root / "multirun.yaml").write_text("hydra:\n  overrides:\n    task:\n    - experiment=ablate_block\n")
    return root


def test_report_lists_every_run_and_marks_the_broken_ones(sweep, capsys):
    main(["report", str(sweep)])
    md = (sweep / "report.md").read_text()
    assert md.strip() in capsys.readouterr().out  # the command prints what it wrote
    rows = [line for line in md.splitlines() if line.startswith("| draft=")]
    assert len(rows) == 4
    # Rows are named by the overrides that differ between runs.
    ok = next(r for r in rows if r.startswith("| draft=dspark_b8,train.max_steps=40 |"))
    cells = [c.strip() for c in ok.strip("|").split("|")]
    assert cells[1:8] == ["dspark_b8", "4", "8", "paper", "2", "40,000", "40"]
    assert cells[8:13] == ["1.800", "1.000", "1.600", "0.60 0.50 0.30 0.10", "0.071 → 0.012"]
    assert cells[13:] == ["2.5 min", "ok"]
    assert "incomplete: no checkpoint, no eval.json" in md and "incomplete: stopped at step 40, no eval.json" in md
    assert "`experiment=ablate_block`" in md
    for png in ("report_acceptance.png", "report_tau_tokens.png"):
        assert (sweep / png).stat().st_size > 5000
    summary = json.loads((sweep / "report.json").read_text())
    assert [s["status"] for s in summary].count("ok") == 2 and summary[0]["trained"]["1"]["tau"] == 1.6


def test_damaged_files_are_reported_not_raised(sweep):
    (sweep / "0_draft=dspark_b8" / "eval.json").write_text("{trunc")
    (sweep / "1_draft=dflash_b8" / "config.yaml").write_text("draft: [unclosed\n")
    runs = {r.name: r for r in read_sweep(sweep)}
    assert runs["0_draft=dspark_b8"].status == "incomplete: no eval.json"
    assert runs["1_draft=dflash_b8"].status == "incomplete: no config.yaml"
    write_report(sweep)


def test_report_logs_to_wandb_offline(sweep, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    write_report(sweep, wandb=True)
    runs = [p for p in (sweep / "wandb").iterdir() if p.name.startswith("offline-run-")]
    assert len(runs) == 1 and any(f.suffix == ".wandb" for f in runs[0].iterdir())
    assert len(read_sweep(sweep)) == 4  # the wandb dir is not taken for a run
    assert os.environ["WANDB_MODE"] == "offline"


def test_run_that_reached_max_steps_is_complete_and_tau_curve_is_read(tmp_path):
    """A run viewed at its configured last step counts as complete (its later checkpoints, if any,
    are not the one reported); tau_curve.json adds measured points to the τ-vs-tokens line."""
    root = tmp_path / "sweep"
    d = _run(root, "0_draft=dspark_b8", steps=40, finished=False)
    with open(d / "config.yaml", "a") as f:
        f.write("train:\n  max_steps: 40\n")
    (d / "tau_curve.json").write_text(json.dumps([{"step": 20, "tokens_seen": 20000, "tau": 1.4},
                                                  {"step": 60, "tokens_seen": 60000, "tau": 2.1},
                                                  {"step": "bad"}]))
    stopped = _run(root, "1_draft=dspark_b16", steps=30, finished=False)
    with open(stopped / "config.yaml", "a") as f:
        f.write("train:\n  max_steps: 40\n")
    runs = read_sweep(root)
    assert runs[0].status == "ok" and runs[0].tau_curve == [(20000, 1.4), (60000, 2.1)]
    assert runs[1].status == "incomplete: stopped at step 30" and runs[1].tau_curve == []
    write_report(root)
    assert (root / "report_tau_tokens.png").stat().st_size > 5000


def test_report_on_a_missing_dir_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="is not a directory"):
        main(["report", str(tmp_path / "nope")])


def test_paired_ratio_is_pooled_tau_over_pooled_tau_with_a_paired_interval():
    import numpy as np

    from splitserve.evaluation.report.ratios import PerPrompt, paired_ratio

    rounds = np.array([10.0, 20.0, 5.0, 8.0])
    a = PerPrompt([(1,), (2,), (3,), (4,)], np.array([30.0, 50.0, 9.0, 20.0]), rounds)
    point, lo, hi = paired_ratio(a, a, samples=500)
    assert point == lo == hi == 1.0  # the same draws for both runs: a run against itself is exactly 1
    b = PerPrompt(a.prompts, a.tokens / 2, rounds)
    point, lo, hi = paired_ratio(a, b, samples=500)
    assert abs(point - 2.0) < 1e-12 and abs(lo - 2.0) < 1e-12 and abs(hi - 2.0) < 1e-12
    c = PerPrompt(a.prompts, np.array([20.0, 60.0, 6.0, 16.0]), rounds)
    point, lo, hi = paired_ratio(a, c, samples=2000)
    assert abs(point - (109 / 43) / (102 / 43)) < 1e-12 and lo < point < hi


def test_an_eagle3_run_reports_its_chain_length_and_no_markov_head(tmp_path):
    """A chain draft's row gives γ = draft.ttt_steps (the tokens a round drafts), no Markov rank,
    and the run is not taken for a DSpark run in the ratio tables (those need markov_rank > 0)."""
    root = tmp_path / "sweep"
    _run(root, "0_draft=dspark_b8")
    d = _run(root, "1_draft=eagle3", draft="eagle3")
    (d / "config.yaml").write_text("draft:\n  name: eagle3\n  family: eagle3\n  block_size: 16\n  markov_rank: 256\n"
                                   "  num_layers: 1\n  ttt_steps: 3\nloss:\n  name: ttt\n  kind: ttt\n")
    runs = {r.draft: r for r in read_sweep(root)}
    assert (runs["eagle3"].block_size, runs["eagle3"].markov_rank) == (3, None)
    assert (runs["dspark_b8"].block_size, runs["dspark_b8"].markov_rank) == (4, 8)
    row = next(line for line in write_report(root).read_text().splitlines() if "| eagle3 |" in line)
    assert "| eagle3 | 3 | - | ttt |" in row, row
