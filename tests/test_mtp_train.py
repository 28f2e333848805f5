"""The target's own MTP head fine-tuned through the one training pipeline (draft=mtp, train/loop.py,
the training-time test of train/ttt.py) on a tiny random DeepSeek-V3 checkpoint: the loss falls,
only the MTP weights move (the embedding, lm_head and the copy of the final norm stay the
target's), and the run's checkpoint loads back and serves the target's own greedy output."""

import json
from pathlib import Path

import pytest
import torch
from mtp_tiny import load_mtp_target, save_mtp_target
from tiny import random_samples

import splitserve.train.loop as loop
from splitserve.config import compose
from splitserve.loading import load_draft, read_draft_meta, target_config_for
from splitserve.config import ModelsConfig
from splitserve.speculative.decode import SpecDecoder, target_decode
from splitserve.speculative.engine import Engine, SamplingParams
from splitserve.stream.sources import TargetSource

pytestmark = pytest.mark.usefixtures("one_thread")


def test_training_moves_only_the_mtp_weights_lowers_the_loss_and_the_run_serves(tmp_path, capsys):
    target = load_mtp_target(save_mtp_target(tmp_path / "target", "deepseek_v3"))
    samples = random_samples([24, 17, 30, 21, 26, 19, 28, 23], target.info.vocab_size, seed=1)
    run = tmp_path / "run"
    cfg_args = ["draft=mtp", "target.name=tiny-mtp", f"target.path={tmp_path / 'target'}", "train.batch_size=4",
                "train.device=cpu", "train.log_every=1", "train.save_every=5", "train.lr=5e-3",
                "train.warmup_steps=2", f"run_dir={run}"]
    cfg = compose([*cfg_args, "train.max_steps=10"])
    assert cfg.target.layer_rule == "last" and cfg.loss.kind == "ttt"
    from mtp_tiny import mtp_draft

    start = {k: v.clone() for k, v in mtp_draft(target).state_dict().items()}
    result = loop.train(cfg, target, source=TargetSource(target, samples))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["loss"] for r in rows[-3:]) / 3 < 0.8 * rows[0]["loss"], rows
    end = result.draft.state_dict()
    moved = {k for k in start if not torch.equal(start[k], end[k].to(start[k].dtype))}
    assert moved and all(k.startswith(("heads.", "blocks.", "out_norms.")) for k in moved), moved
    assert {"heads.0.proj.weight", "blocks.0.self_attn.kv_b_proj.weight"} <= moved

    meta = read_draft_meta(run)
    assert meta.family == "mtp" and target_config_for(meta, ModelsConfig(draft=str(run))).layer_rule == "last"
    loaded = load_draft(meta, target)
    for k, v in loaded.trainable_state_dict().items():
        torch.testing.assert_close(v, end[k].to(v.dtype), rtol=0, atol=0, msg=k)
    prompt = [3, 1, 4, 1, 5, 9]
    ref = target_decode(target, prompt, 16)
    assert SpecDecoder(target, loaded).generate(prompt, 16).tokens == ref
    assert Engine(target, loaded).generate(prompt, SamplingParams(max_tokens=16)).tokens == ref

    capsys.readouterr()
    loop.train(cfg, target, source=TargetSource(target, samples))  # its draft_arch.json fits: it resumes
    assert "resumed from" in capsys.readouterr().out


def test_export_refuses_an_mtp_run_in_one_line(tmp_path):
    from splitserve.cli.export import export_main
    from splitserve.errors import UserError
    from splitserve.models.run_files import ARCH_FILE

    (tmp_path / ARCH_FILE).write_text(json.dumps({"family": "mtp", "arch": {}}))
    with pytest.raises(UserError, match="draft=mtp run: its head is not exported yet") as err:
        export_main([str(tmp_path), str(tmp_path / "out")])
    assert "\n" not in str(err.value)
