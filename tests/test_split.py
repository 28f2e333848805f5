"""Split training end to end under torchrun on CPU (gloo): 1 target rank + 2 draft ranks.

* parity: online split training equals dump-then-train in one process (same losses, same
  final weights within fp32 tolerance), with the plain backend and with DeepSpeed ZeRO-2 plus
  gradient accumulation;
* resume: a job SIGKILLed mid-way and rerun ends with the weights of an uninterrupted run;
* failure: killing the target rank makes every rank exit, naming it, well within 60 s.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}


def _overrides(tiny_smol_dir, run_dir, steps=6, **extra):
    base = {
        "target.path": tiny_smol_dir, "target.name": "tiny-smol", "target.layer_ids": "[0,1,2]",
        "data.train_path": "data/sample_chat.jsonl", "data.heldout_prompts": "data/sample_prompts.jsonl",
        "data.max_length": 64, "draft.num_layers": 1, "draft.intermediate_size": 32, "draft.markov_rank": 4,
        "train.max_steps": steps, "train.batch_size": 4, "train.anchors_per_seq": 4, "train.log_every": 1,
        "train.save_every": 3, "eval.enabled": "false", "run_dir": run_dir, "split.heartbeat_s": 0.2,
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def _cli(*args):
    proc = subprocess.run([sys.executable, "-m", "splitserve.cli", *args], cwd=ROOT, env=ENV,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _torchrun_cmd(*args, nproc=3):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "splitserve.cli", "train", *args]


def _torchrun(*args, nproc=3, timeout=400):
    proc = subprocess.run(_torchrun_cmd(*args, nproc=nproc), cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


def _metrics(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def _final_weights(run_dir):
    ckpt = Path(run_dir) / "checkpoints"
    return load_file(str(ckpt / (ckpt / "latest").read_text().strip() / "draft.safetensors"))


@pytest.fixture(scope="module")
def offline(tiny_smol_dir, tmp_path_factory):
    """Dump-then-train in one process: the reference every split run must equal."""
    root = tmp_path_factory.mktemp("offline")
    dump = root / "dump"
    _cli("dump", *_overrides(tiny_smol_dir, root / "unused"), f"dump.out_dir={dump}", "dump.dtype=float32")
    _cli("train", *_overrides(tiny_smol_dir, root / "run"), f"data.dump_dir={dump}")
    return root / "run"


def _assert_same_run(a, b):
    ma, mb = _metrics(a), _metrics(b)
    assert [m["step"] for m in ma] == [m["step"] for m in mb]
    for x, y in zip(ma, mb):
        for k in ("loss", "ce", "tv", "conf", "alpha"):
            assert x[k] == pytest.approx(y[k], rel=1e-5, abs=1e-6), (x["step"], k)
    wa, wb = _final_weights(a), _final_weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=5e-5, msg=k)


@pytest.mark.parametrize("backend", [
    [],
    ["train.backend=deepspeed", "train.zero_stage=2", "train.grad_accum_steps=2"],
], ids=["plain", "deepspeed-zero2-accum2"])
def test_split_training_equals_dump_then_train(tiny_smol_dir, offline, tmp_path, backend):
    if backend:
        pytest.importorskip("deepspeed")
    run = tmp_path / "split"
    proc = _torchrun(*_overrides(tiny_smol_dir, run), *backend)
    _assert_same_run(offline, run)
    # Telemetry on every log step, and a verdict at the end.
    last = _metrics(run)[-1]
    for key in ("split/consumed_tokens_per_s", "split/produced_tokens_per_s", "split/trainer_wait_fraction",
                "split/channel_bytes_per_s", "split/queue_depth"):
        assert key in last
    summary = json.loads((run / "split_summary.json").read_text())
    assert summary["split"] == "1+2" and summary["consumed_samples"] == 6 * 4
    assert summary["verdict"]["bound"] in ("producer", "consumer", "balanced")
    assert "[split]" in proc.stdout + proc.stderr


def _wait_for(predicate, timeout, what):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _latest_step(run_dir) -> int:
    pointer = Path(run_dir) / "checkpoints" / "latest"
    return int(pointer.read_text().split("_")[1]) if pointer.exists() else 0


def test_split_job_killed_and_rerun_resumes_to_the_same_weights(tiny_smol_dir, tmp_path):
    steps = 40
    args = _overrides(tiny_smol_dir, tmp_path / "run", steps=steps, **{"train.save_every": 5})
    proc = subprocess.Popen(_torchrun_cmd(*args), cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for(lambda: _latest_step(tmp_path / "run") >= 5, 300, "a first checkpoint")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole job, as if the node went down
        proc.wait()
    killed_at = _latest_step(tmp_path / "run")
    assert 5 <= killed_at < steps, "the job was not interrupted mid-way"
    _torchrun(*args)  # the same command again
    assert _latest_step(tmp_path / "run") == steps

    # The reference: the same split job, never interrupted. (Against a single process the
    # weights agree to ~1e-7 except where Adam meets near-zero gradients, e.g. the
    # zero-initialised Markov W2; the same split layout is deterministic.)
    _torchrun(*_overrides(tiny_smol_dir, tmp_path / "ref", steps=steps, **{"train.save_every": 5}))
    ref, resumed = _final_weights(tmp_path / "ref"), _final_weights(tmp_path / "run")
    # bit-equal: the same layout replays the same ops from a checkpoint read back byte for byte
    for k in ref:
        torch.testing.assert_close(resumed[k], ref[k], rtol=0, atol=0, msg=k)
    assert [m["loss"] for m in _metrics(tmp_path / "ref")] == [m["loss"] for m in _metrics(tmp_path / "run")][-steps:]


def test_killing_the_target_rank_stops_every_rank_with_a_message(tiny_smol_dir, tmp_path):
    args = _overrides(tiny_smol_dir, tmp_path / "run", steps=100000, **{"train.save_every": 1000})
    proc = subprocess.Popen(_torchrun_cmd(*args), cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        _wait_for(lambda: (tmp_path / "run" / "metrics.jsonl").exists(), 300, "training to start")

        def workers():
            out = {}
            for child in psutil.Process(proc.pid).children(recursive=True):
                try:
                    rank = child.environ().get("RANK")
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                if rank is not None:
                    out[int(rank)] = child
            return out

        ranks = workers()
        assert set(ranks) == {0, 1, 2}
        t0 = time.time()
        ranks[0].kill()  # rank 0 is the target rank
        out, _ = proc.communicate(timeout=60)
        elapsed = time.time() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert elapsed < 60
    for r in (1, 2):
        assert f"rank {r} (draft {r - 1}) exiting" in out, out[-3000:]
    assert "rank 0 (target 0) died" in out, out[-3000:]


def test_time_budget_ends_the_split_job_cleanly(tiny_smol_dir, tmp_path):
    """Draft ranks stop on the time budget together, and the target rank, still producing,
    is told to stop: every rank exits 0 and the last checkpoint is marked finished."""
    args = _overrides(tiny_smol_dir, tmp_path / "run", steps=100000,
                      **{"train.save_every": 100000, "train.max_minutes": 0.05})
    proc = _torchrun(*args)
    state = json.loads((tmp_path / "run" / "checkpoints" / (tmp_path / "run" / "checkpoints" / "latest").read_text()
                        / "state.json").read_text())
    assert state["finished"] and 0 < state["step"] < 100000
    assert "[split] target rank 0: produced" in proc.stdout + proc.stderr


def test_transport_choice_nccl_payloads_with_a_gpu_per_rank_else_host_staged_gloo(monkeypatch):
    from splitserve.split import runner
    from splitserve.split.runner import Placement, settle_transport

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")

    def gpus(n):
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)

    def got(place):
        return (place.rank, place.backend, place.channel_backend, place.channel_device, place.device)

    cpu, cuda1 = torch.device("cpu"), torch.device("cuda", 1)
    # No GPU: everything on the CPU over gloo, whatever auto or gloo says.
    gpus(0)
    for transport in ("auto", "gloo"):
        assert got(Placement.from_env(transport)) == (1, "gloo", "gloo", cpu, cpu)
    # Two ranks share one GPU: they compute on it, records go through host memory.
    gpus(1)
    for transport in ("auto", "gloo"):
        assert got(Placement.from_env(transport)) == (1, "gloo", "gloo", cpu, torch.device("cuda", 0))
    # A GPU per rank: auto sends payloads GPU to GPU (the default group stays gloo for control
    # traffic); gloo still stages them through host memory on the rank's own GPU.
    gpus(2)
    for transport in ("auto", "nccl"):
        assert got(Placement.from_env(transport)) == (1, "gloo", "nccl", cuda1, cuda1)
    assert got(Placement.from_env("gloo")) == (1, "gloo", "gloo", cpu, cuda1)

    # All ranks must agree: under auto, one rank that cannot use NCCL sends every rank to gloo;
    # an explicit nccl is never overridden (a node short of GPUs already refused it above).
    place = Placement.from_env("auto")
    assert settle_transport(place, "auto", nccl_everywhere=True) == place
    assert got(settle_transport(place, "auto", nccl_everywhere=False)) == (1, "gloo", "gloo", cpu, cuda1)
    assert settle_transport(Placement.from_env("nccl"), "nccl", nccl_everywhere=False).channel_backend == "nccl"

    kw = runner._channel_kw(place, payload_group="nccl group")  # type: ignore[arg-type]
    assert kw["group"] == "nccl group" and kw["device"] == cuda1 and "control_group" in kw
    assert runner._channel_kw(Placement.from_env("gloo"), None) == {"device": cpu}
    for n in (0, 1):
        gpus(n)
        with pytest.raises(RuntimeError, match="needs a GPU per rank.*split.transport=gloo"):
            Placement.from_env("nccl")
    with pytest.raises(ValueError, match="auto, gloo or nccl"):
        Placement.from_env("ncl")
