"""A draft whose logits are not finite (a diverged run, weights that overflow the serving dtype)
still serves: greedy output is the target's own, and T=1 samples follow the target's
distribution. Without the guard (models/finite.py) the T=1 draw raises on a CPU, and on CUDA a
device-side assert ends the whole process."""

import pytest
import torch
from marginals import sample_two_tokens, two_token_marginals
from tiny import tiny_draft, tiny_target

from splitserve.config import DraftConfig, EngineConfig
from splitserve.models.build import build_draft, resolve_arch
from splitserve.speculative.decode import target_decode
from splitserve.speculative.engine import Engine, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")


def _broken(target, family: str):
    """A draft of `family` with one NaN in its lm_head: every logit it computes is NaN."""
    torch.manual_seed(0)
    if family == "eagle3":
        cfg = DraftConfig(family="eagle3", num_layers=1, intermediate_size=48, draft_vocab_size=12, ttt_steps=3)
        draft = build_draft(resolve_arch(cfg, target.info, target.model.config), target).eval()
    else:
        draft = tiny_draft(target, block_size=3, markov_rank=4)
    with torch.no_grad():
        draft.lm_head.weight[0, 0] = float("nan")
    return draft


@pytest.mark.parametrize("family", ["dspark", "eagle3"])
def test_a_draft_with_non_finite_logits_serves_losslessly(family):
    target = tiny_target(seed=5, vocab=16, layers=3, layer_ids=(0, 1))
    with torch.no_grad():
        target.model.lm_head.weight.mul_(0.1)  # soften: many tokens get real probability
    draft = _broken(target, family)
    engine = Engine(target, draft, EngineConfig(max_context=32, seed=0))
    prompt = [1, 2, 3]
    assert engine.generate(prompt, SamplingParams(max_tokens=12)).tokens == target_decode(target, prompt, 12)

    anchor = 7
    p1, p2 = two_token_marginals(target, prompt + [anchor])
    engine._prefill(prompt, 1.0)
    if family == "eagle3":  # the chain's first state, as after a prefill that drew the anchor
        with torch.no_grad():
            engine.drafter.commit(target.capture(torch.tensor([prompt])).aux, 0,
                                  torch.tensor(prompt[1:] + [anchor]), len(prompt) - 1)
        h0 = engine.drafter.h0.clone()
        rewind = lambda: engine.drafter.h0.copy_(h0)  # noqa: E731
    else:
        rewind = None
    n = 1200
    first, second, _ = sample_two_tokens(engine, len(prompt), anchor, n, rewind=rewind)
    # 1200 samples: a frequency's std is at most ~0.015; 0.06 is ~4 sigma.
    assert (first / n - p1).abs().max() < 0.06
    assert (second / n - p2).abs().max() < 0.06
