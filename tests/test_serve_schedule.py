"""Confidence-scheduled verification: the prefix rule on hand-set survivals, and the engine with
the schedule on stays lossless (greedy = the target's greedy, T=1 = the target's distribution)."""

import host_reads
import pytest
import test_serve_engine as base  # a module import: its tests are not collected twice
import torch
from tiny import tiny_draft, tiny_target

from splitserve.config import EngineConfig
from splitserve.speculative.decode import target_decode
from splitserve.speculative.engine import Engine, SamplingParams
from splitserve.speculative.schedule import choose_prefix, linear_cost, prefix_survival

pytestmark = pytest.mark.usefixtures("one_thread")


def _L(a, cost):
    return int(choose_prefix(torch.tensor(a), torch.tensor(cost)))


def test_choose_prefix_by_hand():
    a = [0.9, 0.8, 0.2, 0.1]
    # beta 0.1: cost 1, 1.1, 1.2, 1.3, 1.4; expected 1, 1.9, 2.7, 2.9, 3.0; rate 1, 1.73, 2.25, 2.23:
    # a_3 = 0.2 adds less than its share of the cost -> stop at L = 2.
    assert linear_cost(4, 0.1) == pytest.approx([1.0, 1.1, 1.2, 1.3, 1.4])
    assert _L(a, linear_cost(4, 0.1)) == 2
    assert _L(a, linear_cost(4, 0.0)) == 4  # free verification: take everything
    assert _L(a, linear_cost(4, 1.0)) == 0  # 1.9 / 2 < 1: not even d_1 pays
    # The early stop: L = 1 costs as much as L = 4, which would be the global best, but the rule
    # stops at the first non-improvement (what keeps it non-anticipating).
    assert _L([0.9, 0.9, 0.9, 0.9], [1.0, 2.0, 2.0, 2.0, 2.0]) == 0


def test_prefix_survival_applies_sts():
    conf = torch.tensor([0.8, 0.5, 0.9])
    assert torch.allclose(prefix_survival(conf), torch.tensor([0.8, 0.4, 0.36]))
    temps = torch.tensor([2.0, 1.0, 0.5])
    z = torch.logit(conf) / temps
    assert torch.allclose(prefix_survival(conf, temps), torch.sigmoid(z).cumprod(0), atol=1e-6)


def _spread_confidence(draft, std=2.0):
    """A random draft's c_k are all ~0.5; spread them so that L varies from round to round."""
    torch.nn.init.normal_(draft.confidence.proj.weight, std=std)


@pytest.mark.parametrize("gamma", [4, 8])
def test_greedy_with_schedule_equals_target_greedy(gamma):
    target = tiny_target(seed=gamma)
    draft = tiny_draft(target, block_size=gamma, markov_rank=8)
    torch.nn.init.normal_(draft.markov.w2.weight, std=1.0)
    _spread_confidence(draft)
    draft.confidence_temperatures = [1.5] * gamma  # an STS fit, applied to the raw c_k
    engine = Engine(target, draft, EngineConfig(max_context=64, verify_schedule="confidence", verify_cost_beta=0.3))
    lengths = set()
    real_round = engine._spec_round

    def recording(*step_args):
        real_round(*step_args)
        lengths.add(int(engine.verify_len))

    engine._spec_round = recording
    for prompt in base._prompts(gamma):
        ref = target_decode(target, prompt, 24)
        stats = engine.generate(prompt, SamplingParams(max_tokens=24))
        assert stats.tokens == ref
    assert len(lengths) > 1 and max(lengths) < gamma  # the schedule truncated, and not always alike


def test_scheduled_round_has_no_sync_ops(monkeypatch):
    target = tiny_target(seed=2)
    draft = tiny_draft(target, block_size=4, markov_rank=8)
    engine = Engine(target, draft, EngineConfig(max_context=64, verify_schedule="confidence"))
    engine.generate([1, 2, 3], SamplingParams(max_tokens=4))
    host_reads.assert_steps_sync_free(monkeypatch, host_reads.round_steps(engine, ar=False))


@pytest.mark.parametrize("trunc", [(0, 1.0), (5, 0.8)])
def test_sampling_with_schedule_matches_target_distribution(monkeypatch, trunc):
    """T=1 with the schedule on: test_serve_engine's exact-marginals test, with engines built
    with verify_schedule=confidence and a cost that makes L depend on the drafted tokens."""
    real_init = Engine.__init__
    seen = []

    def scheduled(self, target, draft, cfg=None):
        _spread_confidence(draft, std=3.0)
        cfg = EngineConfig(max_context=cfg.max_context, seed=cfg.seed, verify_schedule="confidence",
                           verify_cost=[1.0, 1.4, 1.6, 1.8])
        real_init(self, target, draft, cfg)
        seen.append(self)
        real_round = self._spec_round

        def recording(*step_args):
            real_round(*step_args)
            self.lengths.append(int(self.verify_len))

        self.lengths = []
        self._spec_round = recording

    monkeypatch.setattr(Engine, "__init__", scheduled)
    base.test_sampling_matches_target_distribution(trunc)
    (engine,) = seen
    counts = torch.bincount(torch.tensor(engine.lengths), minlength=4)
    assert (counts > 0).sum() >= 2 and counts[3] < len(engine.lengths), counts  # L varies, truncation happens


def test_bad_schedule_config():
    target = tiny_target(seed=0)
    draft = tiny_draft(target, block_size=4)
    with pytest.raises(ValueError, match="verify_schedule"):
        Engine(target, draft, EngineConfig(max_context=32, verify_schedule="dynamic"))
    with pytest.raises(ValueError, match="γ\\+1"):
        Engine(target, draft, EngineConfig(max_context=32, verify_schedule="confidence", verify_cost=[1.0, 1.1]))
    assert not Engine(target, draft, EngineConfig(max_context=32)).scheduled  # static is the default
