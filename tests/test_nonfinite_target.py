"""A target whose own logits are not finite (its activations overflow the dtype it runs in, as
float16 does for some model families) is named in one line, at the prompt or at the step where it
happens, and the engine serves the next request; a T>0 draw from a NaN distribution picks an index instead of raising (on CUDA
torch.multinomial's raise is a device-side assert that ends the process). pick_token's draw, the
exponential race, follows the target's distribution."""

import pytest
import torch
from tiny import tiny_draft, tiny_target

from splitserve.config import EngineConfig
from splitserve.errors import UserError
from splitserve.speculative.decode import NonFiniteLogitsError, SpecDecoder, check_logits, pick_token, target_decode
from splitserve.speculative.engine import Engine, SamplingParams
from splitserve.speculative.verify import target_probs

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("top_k", [0, 3])
def test_pick_token_draws_from_the_target_distribution(top_k):
    logits = torch.tensor([2.0, 1.5, 0.3, -0.4, 1.0, -2.0])
    want = target_probs(logits, 0.7, top_k)  # (V,)
    g = torch.Generator().manual_seed(0)
    n = 40_000
    counts = torch.bincount(torch.stack([pick_token(logits, 0.7, g, top_k) for _ in range(n)]), minlength=6)
    freq = counts.double() / n
    # 4 standard errors of a frequency at p = 1/2 over 40,000 draws: 0.01
    assert (freq - want.double()).abs().max() < 0.01, (freq, want)
    if top_k:
        assert counts[want == 0].sum() == 0  # nothing outside the top k


def test_a_nan_distribution_draws_an_index_instead_of_raising():
    g = torch.Generator().manual_seed(0)
    tok = pick_token(torch.full((9,), float("nan")), 1.0, g)
    assert 0 <= int(tok) < 9


def test_check_logits_allows_masked_tokens_only():
    check_logits(torch.tensor([0.5, float("-inf"), 2.0]), torch.float16)  # a masked token is fine
    for bad in ([0.5, float("nan")], [float("inf"), 1.0], [float("-inf")] * 3):
        with pytest.raises(NonFiniteLogitsError) as err:
            check_logits(torch.tensor(bad), torch.float16)
        assert isinstance(err.value, UserError) and "\n" not in str(err.value)
        assert "torch.float16" in str(err.value) and "bfloat16 or float32" in str(err.value)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_target_with_nan_logits_is_named_and_the_engine_serves_on(temperature):
    target = tiny_target(seed=5, vocab=16, layers=3, layer_ids=(0, 1))
    draft = tiny_draft(target, block_size=3, markov_rank=4)
    engine = Engine(target, draft, EngineConfig(max_context=32, seed=0))
    real = engine.target.forward_static

    def overflowing(*args, **kwargs):
        logits, cap = real(*args, **kwargs)
        return torch.full_like(logits, float("nan")), cap

    engine.target.forward_static = overflowing
    params = SamplingParams(max_tokens=8, temperature=temperature, seed=1)
    with pytest.raises(NonFiniteLogitsError, match="not finite"):
        engine.generate([1, 2, 3], params)
    engine.target.forward_static = real
    assert engine.generate([1, 2, 3], SamplingParams(max_tokens=8)).tokens == target_decode(target, [1, 2, 3], 8)

    with torch.no_grad():
        target.model.lm_head.weight[0, 0] = float("nan")  # every logit NaN, in the reference loop too
    with pytest.raises(NonFiniteLogitsError):
        SpecDecoder(target, draft).generate([1, 2, 3], 8, temperature, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("mode", ["spec", "ar"])
def test_a_target_that_overflows_mid_request_is_named_and_the_engine_serves_on(mode):
    """Logits that turn non-finite after the prompt (a long reply drifting into float16's
    overflow) end that request in one line naming where, instead of committing the argmax of a
    NaN; the next request is served exactly. The reference loop says the same."""
    target = tiny_target(seed=5, vocab=16, layers=3, layer_ids=(0, 1))
    draft = tiny_draft(target, block_size=3, markov_rank=4)
    engine = Engine(target, draft, EngineConfig(max_context=64, seed=0))
    real = engine.target.forward_static
    calls = []

    def overflowing_later(*args, **kwargs):
        logits, cap = real(*args, **kwargs)
        calls.append(1)
        if len(calls) > 3:  # the prefill and two steps are fine
            logits = logits.clone()
            logits[..., 0, 2] = float("nan")
        return logits, cap

    engine.target.forward_static = overflowing_later
    with pytest.raises(NonFiniteLogitsError, match="after [1-9][0-9]* generated tokens") as err:
        engine.generate([1, 2, 3], SamplingParams(max_tokens=30), mode=mode)
    assert "\n" not in str(err.value)
    engine.target.forward_static = real
    want = target_decode(target, [4, 5], 12)
    assert engine.generate([4, 5], SamplingParams(max_tokens=12), mode=mode).tokens == want

    decoder = SpecDecoder(target, draft)
    real_cached = target.forward_cached
    calls.clear()

    def cached_later(*args, **kwargs):
        logits, cap = real_cached(*args, **kwargs)
        calls.append(1)
        return (logits.clone().fill_(float("nan")) if len(calls) > 2 else logits), cap

    target.forward_cached = cached_later
    with pytest.raises(NonFiniteLogitsError, match="generated tokens"):
        decoder.generate([1, 2, 3], 30, 0.0)
