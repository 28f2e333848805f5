"""Training bookkeeping: resume after a kill gives the same weights; dump-then-train equals
in-process training; checkpoints refuse damaged files."""

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import splitserve.train.loop as loop
from splitserve.config import DataConfig, DraftConfig, DumpConfig, EvalConfig, RunConfig, TargetConfig, TrainConfig
from splitserve.errors import UserError
from splitserve.loading import load_draft
from splitserve.models.run_files import CheckpointError, CheckpointMismatchError, checkpoint_dirs, latest_checkpoint
from splitserve.target.hf import load_hf_target

SAMPLE_CHAT = str(Path(__file__).resolve().parents[1] / "data" / "sample_chat.jsonl")


def _cfg(tiny_smol_dir, run_dir, **train_kw):
    return RunConfig(
        target=TargetConfig(name="tiny-smol", path=str(tiny_smol_dir), layer_ids=[0, 1, 2]),
        draft=DraftConfig(num_layers=1, block_size=4, markov_rank=4, intermediate_size=32),
        data=DataConfig(train_path=SAMPLE_CHAT, max_length=64),
        train=TrainConfig(**{"max_steps": 6, "batch_size": 2, "anchors_per_seq": 4, "save_every": 3,
                             "log_every": 1, "device": "cpu", **train_kw}),
        eval=EvalConfig(enabled=False),
        run_dir=str(run_dir),
    )


def _weights(draft):
    return {k: v.clone() for k, v in draft.trainable_state_dict().items()}


@pytest.fixture(scope="module")
def tiny_smol_target(tiny_smol_dir):
    return load_hf_target(TargetConfig(name="tiny-smol", path=str(tiny_smol_dir), layer_ids=[0, 1, 2], device="cpu"))


def test_keep_checkpoints_prunes_oldest_or_keeps_all(tiny_smol_dir, tiny_smol_target, tmp_path):
    loop.train(_cfg(tiny_smol_dir, tmp_path / "newest", save_every=1), tiny_smol_target)
    assert list(checkpoint_dirs(tmp_path / "newest")) == [5, 6]  # keep_checkpoints=2 by default
    loop.train(_cfg(tiny_smol_dir, tmp_path / "all", save_every=1, keep_checkpoints=0), tiny_smol_target)
    assert list(checkpoint_dirs(tmp_path / "all")) == [1, 2, 3, 4, 5, 6]
    assert latest_checkpoint(tmp_path / "all") == checkpoint_dirs(tmp_path / "all")[6]


class Killed(Exception):
    pass


def test_resume_after_kill_matches_uninterrupted(tiny_smol_dir, tiny_smol_target, tmp_path, monkeypatch):
    full = loop.train(_cfg(tiny_smol_dir, tmp_path / "full"), tiny_smol_target)
    assert full.state.step == 6 and full.state.finished

    real_save = loop.save_checkpoint

    def save_then_die(run_dir, draft, backend, state, **kw):
        path = real_save(run_dir, draft, backend, state, **kw)
        if state.step == 3:
            raise Killed()
        return path

    monkeypatch.setattr(loop, "save_checkpoint", save_then_die)
    with pytest.raises(Killed):
        loop.train(_cfg(tiny_smol_dir, tmp_path / "killed"), tiny_smol_target)
    monkeypatch.setattr(loop, "save_checkpoint", real_save)
    assert latest_checkpoint(tmp_path / "killed").name == "step_0000003"
    resumed = loop.train(_cfg(tiny_smol_dir, tmp_path / "killed"), tiny_smol_target)
    assert resumed.state.step == 6
    a, b = _weights(full.draft), _weights(resumed.draft)
    assert a.keys() == b.keys()
    # bit-equal: the resumed steps replay the uninterrupted run's ops on the same shapes, from
    # weights and optimizer state read back byte for byte (the batches depend on the step only)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    # The loss curve after the resume point is the same too.
    def losses(p):
        rows = [json.loads(line) for line in (p / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], r["loss"], r["ce"], r["tv"], r["conf"]) for r in rows]

    assert losses(tmp_path / "full")[-3:] == losses(tmp_path / "killed")[-3:]


def test_finished_run_is_not_trained_again(tiny_smol_dir, tiny_smol_target, tmp_path):
    cfg = _cfg(tiny_smol_dir, tmp_path / "run", max_steps=2)
    first = loop.train(cfg, tiny_smol_target)
    again = loop.train(cfg, tiny_smol_target)
    assert again.state.step == first.state.step == 2
    for k, v in _weights(first.draft).items():
        torch.testing.assert_close(v, _weights(again.draft)[k])


def test_finished_run_trains_on_under_larger_limits(tiny_smol_dir, tiny_smol_target, tmp_path, capsys):
    """The README's "the same command with train.max_steps=5000 train.max_minutes=60 resumes this
    run": a run that stopped on its time budget trains on under another budget (and one that
    reached max_steps, under a larger max_steps); the same limits leave it finished."""
    run = tmp_path / "run"
    timed = _cfg(tiny_smol_dir, run, max_minutes=1e-6)  # out of time after its first step
    assert loop.train(timed, tiny_smol_target).state.step == 1
    assert loop.train(timed, tiny_smol_target).state.step == 1  # the same limits: done
    assert "another train.max_minutes, trains it further" in capsys.readouterr().out
    assert loop.train(_cfg(tiny_smol_dir, run, max_minutes=2e-6), tiny_smol_target).state.step == 2
    assert "training on: train.max_minutes 1e-06 -> 2e-06" in capsys.readouterr().out
    more = loop.train(_cfg(tiny_smol_dir, run, max_steps=4, max_minutes=None), tiny_smol_target)
    assert more.state.step == 4 and more.state.finished_under == [4, None]
    assert loop.train(_cfg(tiny_smol_dir, run, max_steps=4, max_minutes=None), tiny_smol_target).state.step == 4


@pytest.mark.parametrize("under, max_steps, max_minutes, reopened", [
    (None, 10, 60.0, False),          # a checkpoint from before the field: stays finished
    ([6, 15.0], 6, 15.0, False),      # the same limits
    ([6, 15.0], 6, 60.0, True),       # stopped on time at step 4: a new budget trains on
    ([6, 15.0], 10, 15.0, True),      # a larger max_steps
    ([6, 15.0], 4, 60.0, False),      # max_steps already reached
])
def test_reopen_if_extended(under, max_steps, max_minutes, reopened):
    from splitserve.train.checkpoint import TrainState, reopen_if_extended

    state = TrainState(step=4, finished=True, finished_under=under)
    why = reopen_if_extended(state, max_steps, max_minutes)
    assert (why is not None) == reopened and state.finished == (not reopened)


def test_dump_then_train_equals_in_process(tiny_smol_dir, tiny_smol_target, tmp_path):
    from splitserve.stream.dump_capture import run_dump

    online = loop.train(_cfg(tiny_smol_dir, tmp_path / "online"), tiny_smol_target)
    cfg = _cfg(tiny_smol_dir, tmp_path / "offline")
    cfg.dump = DumpConfig(out_dir=str(tmp_path / "dump"), shard_tokens=200, dtype="float32")
    run_dump(cfg, tiny_smol_target)
    cfg.data = replace(cfg.data, dump_dir=str(tmp_path / "dump"))
    offline = loop.train(cfg, tiny_smol_target)
    # bit-equal: one target forward per sample in both (sources.TargetSource), and the float32
    # dump gives back its bytes, so both runs train on the same records with the same ops
    for k, v in _weights(online.draft).items():
        torch.testing.assert_close(v, _weights(offline.draft)[k], rtol=0, atol=0)


def test_truncated_checkpoint_is_a_clear_error(tiny_smol_dir, tiny_smol_target, tmp_path):
    cfg = _cfg(tiny_smol_dir, tmp_path / "run", max_steps=1)
    loop.train(cfg, tiny_smol_target)
    f = latest_checkpoint(tmp_path / "run") / "draft.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="draft.safetensors"):
        load_draft(tmp_path / "run", tiny_smol_target)


def test_truncated_newest_checkpoint_resumes_from_the_previous_one(tiny_smol_dir, tiny_smol_target, tmp_path,
                                                                   capsys):
    """Steps 3 and 6 saved, then step 6's weights truncated: a rerun says so in one line, sets it
    aside, resumes from step 3 and ends with the same weights as a run that was never damaged."""
    clean = loop.train(_cfg(tiny_smol_dir, tmp_path / "clean"), tiny_smol_target)
    run = tmp_path / "run"
    loop.train(_cfg(tiny_smol_dir, run), tiny_smol_target)
    assert sorted(checkpoint_dirs(run)) == [3, 6]
    f = checkpoint_dirs(run)[6] / "draft.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    capsys.readouterr()
    again = loop.train(_cfg(tiny_smol_dir, run), tiny_smol_target)
    out = capsys.readouterr().out
    notice = [line for line in out.splitlines() if "unreadable" in line]
    assert len(notice) == 1 and "step_0000006" in notice[0] and "step_0000003" in notice[0]
    assert "resumed from" in out and "step 3" in out
    assert (run / "checkpoints" / "step_0000006.corrupt").is_dir()
    assert latest_checkpoint(run).name == "step_0000006"  # trained again from step 3 and saved
    # bit-equal: the resumed run replays steps 4..6 from step 3's state with the same ops
    for k, v in _weights(again.draft).items():
        torch.testing.assert_close(v, _weights(clean.draft)[k], rtol=0, atol=0)


def test_latest_never_names_a_missing_checkpoint(tiny_smol_dir, tiny_smol_target, tmp_path):
    run = tmp_path / "run"
    loop.train(_cfg(tiny_smol_dir, run), tiny_smol_target)
    shutil.rmtree(checkpoint_dirs(run)[6])  # the broken newest one deleted by hand
    assert latest_checkpoint(run).name == "step_0000003"
    assert (run / "checkpoints" / "latest").read_text() == "step_0000003"
    shutil.rmtree(checkpoint_dirs(run)[3])
    assert latest_checkpoint(run) is None and not (run / "checkpoints" / "latest").exists()


def test_no_readable_checkpoint_is_an_error_not_a_fresh_start(tiny_smol_dir, tiny_smol_target, tmp_path):
    run = tmp_path / "run"
    loop.train(_cfg(tiny_smol_dir, run), tiny_smol_target)
    for d in checkpoint_dirs(run).values():
        (d / "draft.safetensors").write_bytes(b"\0" * 10)
    with pytest.raises(CheckpointError, match="no checkpoint .* is readable"):
        loop.train(_cfg(tiny_smol_dir, run), tiny_smol_target)


def test_loss_chunk_rows_reaches_the_loss_through_the_loop(tiny_smol_dir, tiny_smol_target, tmp_path, monkeypatch):
    """train.loss_chunk_rows reaches the loss through the training loop: the first step's loss and
    acceptance, computed three block positions at a time, are those of all positions at once
    (gradients are compared in test_losses.py; after Adam steps, near-zero gradients of the
    Markov embedding rows amplify rounding, so later weights are not compared here)."""
    def first_step(run_dir, **kw):
        loop.train(_cfg(tiny_smol_dir, run_dir, max_steps=1, **kw), tiny_smol_target)
        return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])

    import splitserve.train.step as step

    chunks = []
    real = step.chunked_row_terms
    monkeypatch.setattr(step, "chunked_row_terms", lambda *a: chunks.append(a[-1]) or real(*a))
    whole = first_step(tmp_path / "whole")
    assert chunks == []
    chunked = first_step(tmp_path / "chunked", loss_chunk_rows=3)
    assert chunks and set(chunks) == {3}
    for key in ("loss", "ce", "tv", "conf", "alpha"):
        assert math.isclose(chunked[key], whole[key], rel_tol=1e-5, abs_tol=1e-7), key
    with pytest.raises(ValueError, match="loss_chunk_rows"):
        loop.train(_cfg(tiny_smol_dir, tmp_path / "bad", loss_chunk_rows=-1), tiny_smol_target)


def _snapshot(run: Path) -> dict[str, bytes]:
    """Every file of a run directory -> its bytes (metrics.jsonl and all)."""
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def _two_layer_cfg(tiny_smol_dir, run, **train_kw):
    cfg = _cfg(tiny_smol_dir, run, **train_kw)
    cfg.draft = replace(cfg.draft, num_layers=2)
    return cfg


def test_another_draft_shape_is_refused_and_changes_nothing(tiny_smol_dir, tiny_smol_target, tmp_path):
    """A rerun of a run dir with draft.num_layers changed is refused in one line naming the field,
    before anything in the run changes (no checkpoint set aside as corrupt, draft_arch.json as it
    was); the original config then resumes the intact checkpoints."""
    run = tmp_path / "run"
    first = loop.train(_cfg(tiny_smol_dir, run, max_steps=2, save_every=1), tiny_smol_target)
    before = _snapshot(run)
    with pytest.raises(UserError) as err:
        loop.train(_two_layer_cfg(tiny_smol_dir, run, max_steps=2, save_every=1), tiny_smol_target)
    msg = str(err.value)
    assert "\n" not in msg and "num_layers 1 in the run vs 2 requested" in msg and "new run_dir" in msg
    assert _snapshot(run) == before
    again = loop.train(_cfg(tiny_smol_dir, run, max_steps=2, save_every=1), tiny_smol_target)
    assert again.state.step == 2 and again.state.finished
    for k, v in _weights(first.draft).items():
        torch.testing.assert_close(v, _weights(again.draft)[k], rtol=0, atol=0)


def test_checkpoints_of_another_draft_shape_are_not_set_aside(tiny_smol_dir, tiny_smol_target, tmp_path):
    """Without draft_arch.json, the checkpoints' own weights show the other shape: refused as a
    mismatch, not renamed *.corrupt, and draft_arch.json not written for the refused shape."""
    run = tmp_path / "run"
    loop.train(_cfg(tiny_smol_dir, run, max_steps=2, save_every=1), tiny_smol_target)
    (run / "draft_arch.json").unlink()
    before = _snapshot(run)
    with pytest.raises(CheckpointMismatchError, match="another draft architecture.*new run_dir"):
        loop.train(_two_layer_cfg(tiny_smol_dir, run, max_steps=2, save_every=1), tiny_smol_target)
    assert _snapshot(run) == before
    assert not list((run / "checkpoints").glob("*.corrupt"))


@pytest.mark.parametrize("pointer", ["", "  \n"])
def test_empty_latest_readers_take_the_newest_checkpoint(tiny_smol_dir, tiny_smol_target, tmp_path, pointer,
                                                         capsys):
    """An empty `checkpoints/latest` is a pointer to nothing, not to checkpoints/ itself: evaluate
    and export (load_draft) take the newest checkpoint, say why, and rewrite `latest`."""
    run = tmp_path / "run"
    trained = loop.train(_cfg(tiny_smol_dir, run, max_steps=2, save_every=1), tiny_smol_target)
    latest = run / "checkpoints" / "latest"
    latest.write_text(pointer)
    loaded = load_draft(run, tiny_smol_target)
    assert "is empty; now step_0000002" in capsys.readouterr().out
    assert latest.read_text() == "step_0000002"
    for k, v in _weights(trained.draft).items():
        torch.testing.assert_close(v, _weights(loaded)[k], rtol=0, atol=0)


def test_empty_latest_resume_falls_back_to_the_newest_readable_checkpoint(tiny_smol_dir, tiny_smol_target,
                                                                          tmp_path, capsys):
    """Resume with an empty `latest` and a damaged newest checkpoint: no traceback, the damaged one
    set aside as before, training resumed from the one under it."""
    run = tmp_path / "run"
    loop.train(_cfg(tiny_smol_dir, run, max_steps=2, save_every=1), tiny_smol_target)
    (run / "checkpoints" / "latest").write_text("")
    f = checkpoint_dirs(run)[2] / "draft.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    capsys.readouterr()
    again = loop.train(_cfg(tiny_smol_dir, run, max_steps=2, save_every=1), tiny_smol_target)
    out = capsys.readouterr().out
    assert "resumed from" in out and "step 1" in out
    assert (run / "checkpoints" / "step_0000002.corrupt").is_dir()
    assert again.state.step == 2 and latest_checkpoint(run).name == "step_0000002"


def test_missing_latest_beside_checkpoints_resumes_from_the_newest(tiny_smol_dir, tiny_smol_target, tmp_path,
                                                                    capsys):
    """A run killed after renaming a checkpoint in but before writing `latest`: resume takes the
    newest checkpoint (complete: only complete ones are renamed in) instead of starting over."""
    run = tmp_path / "run"
    loop.train(_cfg(tiny_smol_dir, run, max_steps=2, save_every=1), tiny_smol_target)
    (run / "checkpoints" / "latest").unlink()
    capsys.readouterr()
    again = loop.train(_cfg(tiny_smol_dir, run, max_steps=2, save_every=1), tiny_smol_target)
    out = capsys.readouterr().out
    assert "latest is missing; now step_0000002" in out and "resumed from" in out and "(step 2, finished)" in out
    assert again.state.step == 2 and (run / "checkpoints" / "latest").read_text() == "step_0000002"


def test_empty_latest_without_checkpoints_is_no_checkpoint(tiny_smol_dir, tiny_smol_target, tmp_path):
    run = tmp_path / "run"
    loop.train(_cfg(tiny_smol_dir, run, max_steps=1), tiny_smol_target)
    for d in checkpoint_dirs(run).values():
        shutil.rmtree(d)
    (run / "checkpoints" / "latest").write_text("")
    with pytest.raises(CheckpointError, match="no checkpoint yet"):
        load_draft(run, tiny_smol_target)
    assert not (run / "checkpoints" / "latest").exists()


def test_resumed_schedule_is_the_new_runs_from_its_first_step(tmp_path):
    """A checkpoint of a 10-step run resumed under max_steps=40: the first resumed step's rate is the
    40-step schedule's at step 10, not the 10-step schedule's end; under the same max_steps it is
    the rate saved."""
    from splitserve.train.backends import PlainBackend, lr_lambda

    model = torch.nn.Linear(2, 2)
    cfg = TrainConfig(lr=1e-3, warmup_steps=2, max_steps=10)
    first = PlainBackend(model, cfg)
    for _ in range(10):
        model(torch.ones(1, 2)).sum().backward()
        first.step()
    first.save(tmp_path, writer=True)
    assert first.lr == pytest.approx(1e-3 * lr_lambda(2, 10)(10))  # the decayed end: 10% of the peak
    for max_steps in (10, 40):
        again = PlainBackend(model, replace(cfg, max_steps=max_steps))
        again.load(tmp_path)
        want = 1e-3 * lr_lambda(2, max_steps)(10)
        assert again.lr == pytest.approx(want)
        assert again.opt.param_groups[0]["lr"] == pytest.approx(want)  # what the next update uses
    assert lr_lambda(2, 40)(10) > 2 * lr_lambda(2, 10)(10)  # so the 40-step case above tells them apart
