"""A toy ablation end to end: a real Hydra multirun of `experiment=ablate_block` through the
console script on a tiny target, then `splitserve report`, `calibrate` and `export` (in-process,
to skip three interpreter start-ups)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from splitserve.cli import PACKAGE_CONF, main

ROOT = Path(__file__).resolve().parents[1]
DRAFTS = ["dspark_b8", "dspark_b16", "dflash_b8", "dflash_b16"]  # splitserve/conf/experiment/ablate_block.yaml
LOSSES = ["paper", "dflash_ce"]
JOBS = [f"draft={d},loss={lo}" for d in DRAFTS for lo in LOSSES]  # Hydra's order: the last key varies fastest


def run_train(*args):
    proc = subprocess.run([sys.executable, "-m", "splitserve.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "WANDB_MODE": "offline"}, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"splitserve {args[0]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="module")
def sweep(tiny_smol_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    run_train("train", "-m", "experiment=ablate_block", f"hydra.sweep.dir={out}",
        f"target.path={tiny_smol_dir}", "target.name=tiny-smol", "target.layer_ids=[0,1,2]",
        "data.train_path=data/sample_chat.jsonl", "data.heldout_prompts=data/sample_prompts.jsonl",
        "draft.num_layers=1", "draft.intermediate_size=32",
        "train.max_steps=3", "train.batch_size=2", "train.anchors_per_seq=4", "train.device=cpu",
        "eval.num_prompts=2", "eval.max_new_tokens=6", "eval.prompt_sets=[humaneval]")
    return out


def test_experiment_files_declare_their_sweeps():
    for name, key, values in (("ablate_block", "draft", DRAFTS), ("ablate_block", "loss", LOSSES),
                              ("ablate_loss", "loss", ["paper", "prefix"]),
                              ("ablate_layers", "draft.num_layers", ["1", "2", "5"])):
        cfg = OmegaConf.load(PACKAGE_CONF / "experiment" / f"{name}.yaml")
        assert cfg.hydra.sweeper.params[key].split(",") == values
        if "." not in key:  # a config group: every swept option is a file (prefix.yaml comes with its loss)
            missing = {v for v in values if not (PACKAGE_CONF / key / f"{v}.yaml").exists()}
            assert missing <= {"prefix"}, missing


def test_sweep_report_has_one_row_per_run(sweep, capsys):
    jobs = sorted(p for p in sweep.iterdir() if (p / ".hydra").is_dir())
    assert len(jobs) == len(JOBS)
    main(["report", str(sweep)])
    md = (sweep / "report.md").read_text()
    assert md.strip() in capsys.readouterr().out
    header = next(line for line in md.splitlines() if line.startswith("| run |"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines() if line.startswith("| draft=")]
    assert [r[0] for r in rows] == JOBS
    for r in rows:
        row = dict(zip(columns, r))
        assert row["status"] == "ok" and row["layers"] == "1" and row["steps"] == "3"
        assert int(row["tokens trained"].replace(",", "")) > 0
        for col in ("τ greedy", "τ untrained", "τ T=1"):  # ablate_block also measures T=1
            assert 1.0 <= float(row[col]) <= int(row["γ"]) + 1, (col, row)
        acceptance = [float(a) for a in row["acceptance a1..aγ"].split()]
        assert len(acceptance) == int(row["γ"]) and all(0 <= a <= 1 for a in acceptance)
        # DSpark has a confidence head, so training's held-out evaluation calibrated it.
        assert (row["conf. ECE (STS)"] != "-") == row["draft"].startswith("dspark")
    assert {r[2] for r in rows} == {"8", "16"} and {r[3] for r in rows} == {"256", "0"}
    # The ratio table names its baseline: DFlash on CE alone (paper-defined) and DFlash on the
    # DSpark run's own loss (head-only), per prompt set and temperature, with paired intervals.
    ratios = [[c.strip() for c in line.strip("|").split("|")] for line in md.split("## DSpark over DFlash")[1]
              .splitlines() if line.startswith("| ") and not line.startswith("| prompt set")]
    got = {(r[0], r[1], r[2], r[3], r[4]) for r in ratios}
    for g in ("8", "16"):
        for t in ("0", "1"):
            for ps in ("sample_prompts.jsonl", "humaneval"):
                run = f"draft=dspark_b{g},loss=paper"
                assert (ps, t, "paper-defined", run, f"draft=dflash_b{g},loss=dflash_ce") in got
                assert (ps, t, "head-only", run, f"draft=dflash_b{g},loss=paper") in got
    for r in ratios:
        tau, base, ratio = float(r[5]), float(r[6]), float(r[7])
        lo, hi = (float(x) for x in r[8].split("–"))
        assert abs(ratio - tau / base) < 2e-3 and lo <= ratio <= hi
    for png in ("report_acceptance.png", "report_tau_tokens.png"):
        assert (sweep / png).stat().st_size > 5000


def test_calibrate_cli_then_export_carries_it(sweep, tiny_smol_dir, tmp_path, capsys):
    job = next(p for p in sorted(sweep.iterdir()) if p.name.startswith("0_"))
    (job / "calibration.json").unlink()
    main(["calibrate", str(job), "--temperature", "0", "--temperature", "1", "--num-prompts", "2"])
    out = capsys.readouterr().out
    assert "STS calibration at T=0" in out and "STS calibration at T=1" in out
    cal = json.loads((job / "calibration.json").read_text())
    assert [f["sampling_temperature"] for f in cal["fits"]] == [0.0, 1.0]
    assert all(len(f["temperatures"]) == 8 and f["ece_after"] <= f["ece_before"] + 1e-9 for f in cal["fits"])
    main(["export", str(job), str(tmp_path / "export"), "--target", str(tiny_smol_dir)])
    exported = json.loads((tmp_path / "export" / "config.json").read_text())
    assert exported["confidence_temperatures"] == cal["fits"][0]["temperatures"]
    assert json.loads((tmp_path / "export" / "calibration.json").read_text()) == cal
