"""The greedy Markov stage over top-K candidates (models/candidate_chain.py) and its chain kernel."""

import pytest
import torch
from floats import assert_tie_free

from splitserve.config import EngineConfig
from splitserve.models.candidate_chain import chain_argmax_reference, supports_candidates
from splitserve.speculative.decode import target_decode
from splitserve.speculative.engine import Engine, SamplingParams
from tests.tiny import VOCAB, tiny_draft, tiny_draft_round, tiny_target


def test_chain_follows_the_transition_row_of_the_previous_choice():
    # K = 3 candidates, γ = 3. Hand-set: position 2's best depends on position 1's choice.
    first = torch.tensor([0.0, 2.0, 1.0])
    vals = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 5.0]])
    trans = torch.zeros(2, 3, 3)
    trans[0, 1] = torch.tensor([0.0, 0.0, 3.0])  # after candidate 1: candidate 2 wins (1 + 3)
    trans[0, 0] = torch.tensor([9.0, 0.0, 0.0])  # never used: candidate 0 is not chosen first
    trans[1, 2] = torch.tensor([6.0, 0.0, 0.0])  # after candidate 2: 0 + 6 beats 5 + 0
    assert chain_argmax_reference(first, vals, trans).tolist() == [1, 2, 0]
    # Ties go to the first index, like torch.argmax (documented; the sums here are exact).
    assert chain_argmax_reference(torch.ones(3), torch.ones(2, 3), torch.zeros(2, 3, 3)).tolist() == [0, 0, 0]


def _exact_stage_logits(draft, ctx, anchor, tokens):
    """U_k + B(x_{k-1}) of a round at position 13 whose previous tokens are [anchor, tokens..]."""
    with torch.no_grad():
        h = draft.backbone(draft.block_inputs(anchor.view(1)), torch.arange(13, 13 + len(tokens))[None], ctx, None)[0]
        return draft.logits(h, torch.cat([anchor.view(1), tokens[:-1]]))


@pytest.mark.parametrize("head", ["vanilla", "gated"])
def test_all_candidates_give_the_exact_stage(head):
    for seed in range(4):
        draft, ctx, anchor = tiny_draft_round(seed, head)
        exact, _, conf = draft.draft(ctx, anchor, 13)
        full, _, conf_full = draft.draft(ctx, anchor, 13, markov_topk=VOCAB - 1)  # every token but one
        # The chain adds the bias in other products than the exact stage: tie-free, so exact.
        assert_tie_free(_exact_stage_logits(draft, ctx, anchor, exact))
        assert full.tolist() == exact.tolist()
        torch.testing.assert_close(conf_full, conf)


@pytest.mark.parametrize("head", ["vanilla", "gated"])
def test_few_candidates_stay_inside_each_positions_top_k_and_follow_the_bias(head):
    draft, ctx, anchor = tiny_draft_round(7, head)
    with torch.no_grad():
        pos = torch.arange(13, 19)[None]
        h = draft.backbone(draft.block_inputs(anchor.view(1)), pos, ctx, None)[0]
        base = draft.lm_head(h)  # (γ, V)
    tokens, _, _ = draft.draft(ctx, anchor, 13, markov_topk=3)
    top3 = base.topk(3, dim=-1).indices  # bit-equal to the round's: the same ops on the same shapes
    assert all(t in row for t, row in zip(tokens.tolist(), top3.tolist()))
    # Each choice is the best of its 3 candidates under the bias from the previous choice.
    prev = torch.cat([anchor.view(1), tokens[:-1]])
    with torch.no_grad():
        logits = draft.logits(h, prev)  # (γ, V): U_k + B(x_{k-1})
    assert_tie_free(logits.gather(1, top3))  # the chain scores them with other products: tie-free, so exact
    for k in range(6):
        cands = top3[k]
        assert int(tokens[k]) == int(cands[logits[k, cands].argmax()])


def test_heads_that_carry_a_state_keep_the_exact_stage():
    draft, ctx, anchor = tiny_draft_round(3, "rnn")
    assert not supports_candidates(draft.markov)
    exact, _, _ = draft.draft(ctx, anchor, 13)
    # bit-equal: both calls run the exact stage, the same ops on the same shapes
    assert draft.draft(ctx, anchor, 13, markov_topk=2)[0].tolist() == exact.tolist()


@pytest.mark.parametrize("topk", [1, 4])
def test_engine_with_candidates_still_gives_the_target_greedy_output(topk):
    target = tiny_target(seed=11)
    draft = tiny_draft(target, block_size=6, markov_rank=8)
    torch.nn.init.normal_(draft.markov.w2.weight, std=1.0)
    engine = Engine(target, draft, EngineConfig(max_context=64, markov_topk=topk))
    g = torch.Generator().manual_seed(5)
    for _ in range(3):
        prompt = torch.randint(0, VOCAB - 1, (7,), generator=g).tolist()
        assert engine.generate(prompt, SamplingParams(max_tokens=20)).tokens == target_decode(target, prompt, 20)
    with pytest.raises(ValueError, match="markov_topk"):
        Engine(target, draft, EngineConfig(max_context=64, markov_topk=-1))
