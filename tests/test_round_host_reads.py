"""No host reads in a serving round for the layer kinds and draft families beyond the dense
DSpark case (test_serve_engine, test_eagle3_serve): a hybrid target's round and its recurrent
rewind, the target's own MTP head as the draft, and a draft with a context window. A host read
here would pass every CPU test and turn CUDA graphs off on a GPU (tests/host_reads.py)."""

import host_reads
import pytest
import torch
from mtp_tiny import load_mtp_target, mtp_draft, save_mtp_target
from test_recurrent_rewind import hybrid
from tiny import tiny_draft, tiny_target

from splitserve.config import EngineConfig
from splitserve.speculative.engine import Engine, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")


def _prefilled(target, draft, **cfg) -> Engine:
    engine = Engine(target, draft, EngineConfig(max_context=64, min_window=16, **cfg))
    engine.generate([1, 2, 3, 4, 5], SamplingParams(max_tokens=4))  # state: a prefilled request
    return engine


@pytest.mark.parametrize("arch", ["qwen3-next", "nemotron-h"])
def test_a_hybrid_targets_round_and_rewind_read_nothing(arch, monkeypatch):
    target = hybrid(arch)
    engine = _prefilled(target, tiny_draft(target, block_size=4, markov_rank=8).eval())
    assert engine._recurrent
    # the rewind after a round: the first `keep` verified tokens become the recurrent state
    rewinds = [lambda t, tr, k=keep: engine.target.commit_static(engine.cache, k) for keep in (1, engine.gamma + 1)]
    spec, ar = host_reads.round_steps(engine)
    host_reads.assert_steps_sync_free(monkeypatch, [spec, *rewinds, ar])  # in the order the engine runs them


def test_an_mtp_heads_round_reads_nothing(tmp_path, monkeypatch):
    target = load_mtp_target(save_mtp_target(tmp_path / "t", "deepseek_v3"))
    engine = _prefilled(target, mtp_draft(target, steps=3))
    host_reads.assert_steps_sync_free(monkeypatch, host_reads.round_steps(engine, ar=False))


@pytest.mark.parametrize("attention", ["kernel", "sdpa"])
def test_a_windowed_drafts_round_reads_nothing(attention, monkeypatch):
    target = tiny_target(seed=2)
    torch.manual_seed(0)
    draft = tiny_draft(target, block_size=4, markov_rank=8, context_window=3).eval()
    engine = _prefilled(target, draft, draft_attention=attention)
    host_reads.assert_steps_sync_free(monkeypatch, host_reads.round_steps(engine))
