"""EAGLE-3 through the one training pipeline (train/loop.py): it learns, resumes after a kill to
the same weights and vocabulary, trains the same from a dump, and its run loads back."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from tiny import random_samples, tiny_target

import splitserve.train.loop as loop
from splitserve.config import DumpConfig, compose
from splitserve.errors import UserError
from splitserve.loading import load_draft, read_draft_meta
from splitserve.models.build import resolve_arch
from splitserve.models.run_files import check_arch, latest_checkpoint, save_arch
from splitserve.stream.sources import TargetSource
from splitserve.target.hf import load_hf_target

SAMPLE_CHAT = str(Path(__file__).resolve().parents[1] / "data" / "sample_chat.jsonl")


def _cfg(run_dir, *overrides):
    """`splitserve train draft=eagle3 ...` as composed from conf/, for a tiny run."""
    return compose(["draft=eagle3", "target.name=tiny-llama", "target.layer_ids=[1,2,4]", "draft.intermediate_size=48",
                    "draft.draft_vocab_size=64", "train.batch_size=4", "train.device=cpu", "train.log_every=1",
                    "train.save_every=2", "train.max_steps=4", f"run_dir={run_dir}", *overrides])


@pytest.fixture(scope="module")
def tiny():
    """A sharp tiny target (V=96) and random sequences, every token trained."""
    target = tiny_target(seed=5)
    return target, random_samples([24, 17, 30, 21, 26, 19, 28, 23], target.info.vocab_size, seed=1)


def _losses(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def _weights(draft):
    return {k: v.clone() for k, v in draft.trainable_state_dict().items()}


def test_training_steps_reduce_the_ttt_loss(tiny, tmp_path):
    target, samples = tiny
    cfg = _cfg(tmp_path / "run", "train.max_steps=12", "train.lr=6e-3", "train.warmup_steps=2", "train.save_every=12")
    result = loop.train(cfg, target, source=TargetSource(target, samples))
    rows = _losses(tmp_path / "run")
    first, last = rows[0], sum(r["loss"] for r in rows[-3:]) / 3
    assert last < 0.6 * first["loss"], (first, rows[-3:])
    assert rows[-1]["alpha"] > first["alpha"]  # the chains' teacher-forced acceptance grows
    # the vocabulary is the data's: 64 of 96 ids, the map from the data, not the first 64 ids
    vocab = result.draft.vocab
    assert vocab.size == 64 and not torch.equal(vocab.used, torch.arange(64))


class Killed(Exception):
    pass


def test_resume_after_kill_gives_the_uninterrupted_weights_and_vocabulary(tiny, tmp_path, monkeypatch):
    target, samples = tiny
    full = loop.train(_cfg(tmp_path / "full"), target, source=TargetSource(target, samples))
    real_save = loop.save_checkpoint

    def save_then_die(run_dir, draft, backend, state, **kw):
        path = real_save(run_dir, draft, backend, state, **kw)
        if state.step == 2:
            raise Killed()
        return path

    monkeypatch.setattr(loop, "save_checkpoint", save_then_die)
    with pytest.raises(Killed):
        loop.train(_cfg(tmp_path / "killed"), target, source=TargetSource(target, samples))
    monkeypatch.setattr(loop, "save_checkpoint", real_save)
    resumed = loop.train(_cfg(tmp_path / "killed"), target, source=TargetSource(target, samples))
    assert resumed.state.step == 4
    a, b = _weights(full.draft), _weights(resumed.draft)
    assert a.keys() == b.keys() and {"d2t", "t2d", "lm_head.weight", "fc.weight"} <= set(a)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    def curve(run):
        return [(r["step"], r["loss"], r["ce"], r["tv"], r["alpha"]) for r in _losses(run)]

    assert curve(tmp_path / "full")[-2:] == curve(tmp_path / "killed")[-2:]
    # The run loads back as the trainer left it: its family, arch, vocabulary and weights.
    meta = read_draft_meta(tmp_path / "full")
    assert meta.family == "eagle3" and meta.arch == full.draft.arch
    loaded = load_draft(meta, target)
    assert loaded.d2t.dtype == torch.long and loaded.t2d.dtype == torch.bool
    for k, v in _weights(loaded).items():
        torch.testing.assert_close(v, a[k], rtol=0, atol=0, msg=k)


def test_a_run_of_another_family_is_refused_in_one_line(tiny, tmp_path):
    target, _ = tiny
    eagle = resolve_arch(_cfg(tmp_path).draft, target.info, target.model.config)
    dspark = resolve_arch(compose(["draft=dspark_b8"]).draft, target.info, target.model.config)
    save_arch(tmp_path, dspark, "somewhere")  # family "dspark"
    with pytest.raises(UserError, match=r"holds a dspark draft, not a eagle3 one"):
        check_arch(tmp_path, eagle, "eagle3")
    check_arch(tmp_path, dspark, "dspark")


def test_dump_then_train_equals_in_process(tiny_smol_dir, tmp_path):
    """The vocabulary counted from a dump's token index is the one counted from the tokenized
    data, and training from the dump gives the in-process run's weights bit for bit."""
    from splitserve.stream.dump_capture import run_dump
    from splitserve.train.vocab import training_tokens

    def cfg(run):
        return compose(["draft=eagle3", f"target.path={tiny_smol_dir}", "target.name=tiny-smol",
                        "target.layer_ids=[0,1,2]", f"data.train_path={SAMPLE_CHAT}", "data.max_length=64",
                        "draft.intermediate_size=32", "draft.draft_vocab_size=40", "train.max_steps=2",
                        "train.batch_size=2", "train.device=cpu", "train.save_every=2", f"run_dir={run}"])

    target = load_hf_target(replace(cfg("x").target, device="cpu"))
    online = loop.train(cfg(tmp_path / "online"), target)
    offline_cfg = cfg(tmp_path / "offline")
    offline_cfg.dump = DumpConfig(out_dir=str(tmp_path / "dump"), shard_tokens=200, dtype="float32")
    run_dump(offline_cfg, target)
    offline_cfg.data = replace(offline_cfg.data, dump_dir=str(tmp_path / "dump"))
    offline = loop.train(offline_cfg, target)
    for k, v in _weights(online.draft).items():
        torch.testing.assert_close(v, _weights(offline.draft)[k], rtol=0, atol=0, msg=k)
    # a split job's draft rank has neither: it tokenizes the data as the target ranks do
    from splitserve.models.vocab_map import count_tokens

    counted = [count_tokens(training_tokens(c, target, source), target.info.vocab_size)
               for c, source in ((cfg("a"), None), (offline_cfg, None))]
    assert torch.equal(counted[0], counted[1]) and int(counted[0].sum()) > 0
    assert latest_checkpoint(tmp_path / "offline").name == "step_0000002"
