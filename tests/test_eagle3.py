"""EAGLE-3 as a draft family: the training-time test equals drafting chains step by step, the
mask's pattern, the draft vocabulary's maps, the loss rows by hand, and the registry's refusals."""

import math

import pytest
import torch
from tiny import VOCAB, tiny_target

from splitserve.config import DraftConfig, LossConfig, RunConfig
from splitserve.errors import UserError
from splitserve.models.build import build_draft, resolve_arch
from splitserve.models.eagle3 import Eagle3Cache, eagle3_layer_ids, ttt_mask
from splitserve.models.families import FAMILIES, get_family
from splitserve.models.vocab_map import VocabMap, build_vocab_map, count_tokens, top_tokens
from splitserve.train.losses import LossInputs, compute_loss, ttt_row_terms


@pytest.fixture(scope="module")
def target():
    return tiny_target(seed=3)


def _draft(target, layers=2, vocab=64, steps=3):
    torch.manual_seed(0)
    cfg = DraftConfig(family="eagle3", num_layers=layers, intermediate_size=48, draft_vocab_size=vocab, ttt_steps=steps)
    draft = build_draft(resolve_arch(cfg, target.info, target.model.config), target).eval()
    for p in draft.parameters():  # the residual starts small at init: make every weight matter
        if p.requires_grad and p.dim() == 2:
            torch.nn.init.normal_(p, std=0.2)
    return draft


def test_ttt_mask_pattern():
    expect = torch.tensor([[1, 0, 0, 1, 0, 0, 1, 0, 0],
                           [1, 1, 0, 0, 1, 0, 0, 1, 0],
                           [1, 1, 1, 0, 0, 1, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(ttt_mask(3, 2)[0, 0], expect)
    assert torch.equal(ttt_mask(3, 0)[0, 0], expect[:, :3])


def test_training_time_test_equals_chains_drafted_step_by_step(target, monkeypatch):
    """Step j at position t of the batched unroll is the j-th step of a chain drafted after the
    target's position t: prefill positions 0..t with the target's states through the KV cache,
    then read one teacher-forced token per step with the draft's own previous state."""
    draft = _draft(target)
    steps, b, t = 3, 2, 15
    ids = torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        aux = target.capture(ids).aux  # (B, T, m*D)
        unrolled = draft.unroll(aux, ids, steps)  # k x (B, T-1, D)
        for start in (0, 4, 9, t - 1 - steps):
            cache = Eagle3Cache()
            pos = torch.arange(1, start + 2).expand(b, -1)  # the tokens x_1..x_{start+1}
            h = draft.backbone(draft.fuse(aux[:, : start + 1]), ids[:, 1: start + 2], pos, cache)[:, -1:]
            torch.testing.assert_close(h[:, 0], unrolled[0][:, start], rtol=1e-4, atol=1e-4)
            for j in range(1, steps):
                logits, h = draft.step(h, ids[:, start + 1 + j: start + 2 + j], pos[:, -1:] + j, cache)
                torch.testing.assert_close(h[:, 0], unrolled[j][:, start], rtol=1e-4, atol=1e-4,
                                           msg=f"step {j} at position {start}")
            assert cache.length == start + steps
            # the chain's logits are over target ids, -inf off the draft vocabulary
            assert logits.shape == (b, 1, VOCAB) and torch.isinf(logits[..., ~draft.t2d]).all()
    # A causal mask over every earlier step (other positions' chains included) fails it: the test bites.
    import splitserve.models.eagle3 as eagle3

    def causal_everywhere(u, step, device=None):
        return torch.ones(u, u, dtype=torch.bool, device=device).tril().repeat(1, step + 1)[None, None]

    monkeypatch.setattr(eagle3, "ttt_mask", causal_everywhere)
    with torch.no_grad():
        leaky = draft.unroll(aux, ids, steps)
    torch.testing.assert_close(leaky[0], unrolled[0])
    assert not torch.allclose(leaky[1][:, 4], unrolled[1][:, 4], rtol=1e-3, atol=1e-3)


def test_the_draft_state_reads_later_steps_only_through_its_chain(target):
    """Changing token x_{10}: rows whose chains never read it are unchanged (the mask hides other
    positions' later steps), rows that do read it change."""
    draft = _draft(target, layers=1)
    ids = torch.randint(0, VOCAB, (1, 14), generator=torch.Generator().manual_seed(2))
    other = ids.clone()
    other[0, 10] = (other[0, 10] + 1) % VOCAB
    with torch.no_grad():
        aux = target.capture(ids).aux  # the same target states: only the draft's token input differs
        a, b = draft.unroll(aux, ids, 3), draft.unroll(aux, other, 3)
    for j in range(3):
        reads = torch.arange(13) >= 9 - j  # row t of step j reads x_{t+1+i}, i <= j, and rows before it
        torch.testing.assert_close(a[j][0, ~reads], b[j][0, ~reads])
        assert not torch.allclose(a[j][0, 9 - j], b[j][0, 9 - j])


def test_vocab_map_round_trip_and_layout():
    counts = torch.tensor([0, 5, 2, 9, 2, 0, 7, 1])  # V = 8
    vocab = build_vocab_map(counts, 4)
    assert vocab.used.tolist() == [1, 2, 3, 6]  # 9, 7, 5, then 2 at the lower id of the tie
    assert vocab.d2t.tolist() == [1, 1, 1, 3] and vocab.d2t.dtype == torch.long  # target = draft + d2t[draft]
    assert vocab.t2d.tolist() == [False, True, True, True, False, False, True, False]
    draft_ids = torch.arange(4)
    assert torch.equal(vocab.to_draft(vocab.to_target(draft_ids)), draft_ids)
    assert vocab.to_draft(torch.tensor([[0, 6], [4, 3]])).tolist() == [[-1, 3], [-1, 2]]
    # fewer distinct trained tokens than draft ids: the lowest unused ids fill the rest
    assert top_tokens(torch.tensor([0, 0, 3, 0, 0, 1]), 4).tolist() == [0, 1, 2, 5]
    assert count_tokens([([1, 2, 2, 5], [1, 0, 1, 1]), (torch.tensor([2]), torch.tensor([True]))], 6).tolist() == \
        [0, 1, 2, 0, 0, 1]
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        count_tokens([([7], [1])], 6)
    with pytest.raises(ValueError, match="distinct"):
        VocabMap.from_ids(torch.tensor([1, 1]), 8)
    with pytest.raises(ValueError, match="different target ids"):
        VocabMap(torch.tensor([0, 0]), torch.tensor([True, False, True])).check()


def test_set_vocab_restarts_the_lm_head_from_the_target_rows(target):
    draft = _draft(target, vocab=8)
    vocab = VocabMap.from_ids(torch.tensor([3, 10, 50, 60, 61, 62, 80, 95]), VOCAB)
    draft.set_vocab(vocab)
    torch.testing.assert_close(draft.lm_head.weight, target.lm_head_weight()[vocab.used])
    state = draft.trainable_state_dict()
    assert {"d2t", "t2d", "lm_head.weight"} <= set(state) and not any(k.startswith("embed") for k in state)
    assert not any(k.startswith("target_lm_head") for k in state)
    with pytest.raises(ValueError, match="does not fit"):
        draft.set_vocab(VocabMap.first(4, VOCAB))


def test_layer_convention():
    assert eagle3_layer_ids(36) == [1, 17, 32]  # as hidden_states indices [2, 18, 33]: speculators' rule
    assert [i + 1 for i in eagle3_layer_ids(32)] == [2, 32 // 2, 32 - 3]


def test_ttt_rows_hand_computed():
    """N = 2 of V = 3: the target puts 0.2 on the token the draft lacks."""
    p_d = torch.tensor([[0.5, 0.5], [0.9, 0.1]])
    p_t = torch.tensor([[0.6, 0.2], [0.4, 0.4]])  # over the draft tokens; 0.2 elsewhere
    rows = ttt_row_terms(p_d.log(), p_t.log(), torch.tensor([1, -1]))
    q = p_t / p_t.sum(-1, keepdim=True)
    kl = (q * (q.log() - p_d.log())).sum(-1)
    torch.testing.assert_close(rows.kl, kl)
    torch.testing.assert_close(rows.tv, torch.tensor([0.1 + 0.3 + 0.2, 0.5 + 0.3 + 0.2]))
    torch.testing.assert_close(rows.ce, torch.tensor([-math.log(0.5), 0.0]))
    x = LossInputs(None, None, labels=torch.tensor([1, -1]), slot=torch.tensor([0, 1]), conf_logits=None,
                   block_size=2, block=torch.tensor([7, 7]), rows=rows, row_weight=torch.tensor([1.0, 0.8]))
    out = compute_loss(x, LossConfig(name="ttt", kind="ttt", kl_weight=1.0, ce_weight=0.5, tv_weight=0.0))
    l_kl = (kl[0] + 0.8 * kl[1]) / 1.8
    torch.testing.assert_close(out.total, l_kl + 0.5 * -math.log(0.5))
    torch.testing.assert_close(out.alpha, torch.tensor([0.7, 0.5]))
    assert math.isclose(float(out.exp_len), 1 + 0.7 + 0.7 * 0.5, rel_tol=1e-6)  # along the position's steps


def test_registry_refuses_unknown_families_and_misfit_losses_in_one_line(target):
    from splitserve.train.objectives import OBJECTIVES, objective_for

    assert set(OBJECTIVES) == set(FAMILIES) >= {"dspark", "dflash", "eagle3"}
    for refuse in (lambda: resolve_arch(DraftConfig(family="medusa"), target.info, target.model.config),
                   lambda: get_family("medusa"),
                   lambda: objective_for(RunConfig(draft=DraftConfig(family="medusa")))):
        with pytest.raises(UserError) as err:
            refuse()
        msg = str(err.value)
        assert "\n" not in msg and "draft.family='medusa'" in msg and "dflash, dspark, eagle3" in msg
    with pytest.raises(UserError, match="^draft.family=eagle3 trains with loss.kind ttt, not 'paper'"):
        objective_for(RunConfig(draft=DraftConfig(family="eagle3")))
    from splitserve.config import compose

    objective_for(compose(["draft=eagle3", "eval.enabled=true"]))  # the held-out evaluation drafts with it
    with pytest.raises(UserError, match="draft.ttt_steps=0: must be positive"):
        objective_for(compose(["draft=eagle3", "draft.ttt_steps=0"]))
    with pytest.raises(UserError, match="loss.kind=ttt is EAGLE-3's"):
        objective_for(RunConfig(loss=LossConfig(kind="ttt")))
    with pytest.raises(UserError, match="draft.family=dflash has no Markov or confidence head"):
        resolve_arch(DraftConfig(family="dflash"), target.info, target.model.config)
    with pytest.raises(ValueError, match="kl_weight"):
        x = LossInputs(torch.zeros(1, 3), torch.zeros(1, 3), torch.tensor([0]), torch.tensor([0]), None, 4)
        compute_loss(x, LossConfig(kl_weight=1.0))


def test_draft_eagle3_composes_its_family_capture_and_loss():
    from splitserve.config import compose

    cfg = compose(["draft=eagle3"])
    assert (cfg.draft.family, cfg.draft.num_layers, cfg.draft.ttt_steps, cfg.draft.ttt_decay) == ("eagle3", 1, 3, 0.8)
    assert (cfg.loss.kind, cfg.loss.kl_weight, cfg.loss.ce_weight, cfg.loss.tv_weight) == ("ttt", 1.0, 0.0, 0.0)
    assert cfg.target.num_capture_layers == 3 and cfg.eval.enabled
    assert compose(["draft=dflash_b8"]).draft.family == "dflash" and compose([]).loss.kind == "paper"


def test_chunked_rows_give_the_loss_and_gradients_of_all_rows_at_once(target):
    """train.loss_chunk_rows > 0 computes the rows (and the target's log-probabilities) a chunk at
    a time; the loss, its E[tau] and the gradients are those of all rows at once."""
    from tiny import random_samples

    from splitserve.stream.sources import TargetSource
    from splitserve.train.step import collate
    from splitserve.train.ttt import plan_ttt, ttt_draft_loss

    draft = _draft(target, layers=1, vocab=48).train()
    records = TargetSource(target, random_samples([13, 9, 16], VOCAB, seed=4)).get([0, 1, 2])
    batch = collate(records, torch.device("cpu"), torch.float32)
    plan = plan_ttt(batch, 3)
    cfg = LossConfig(name="ttt", kind="ttt", kl_weight=1.0, ce_weight=0.3, tv_weight=0.2, conf_weight=0.0)
    outs, grads = [], []
    for chunk in (0, 5):
        draft.zero_grad()
        out = ttt_draft_loss(draft, batch, plan, cfg, 0.8, chunk_rows=chunk)
        out.total.backward()
        outs.append(out)
        grads.append([p.grad.clone() for p in draft.parameters() if p.requires_grad])
    for key in ("total", "ce", "tv", "alpha", "exp_len"):
        torch.testing.assert_close(getattr(outs[0], key), getattr(outs[1], key), msg=key)
    for g0, g1 in zip(*grads):
        torch.testing.assert_close(g0, g1, rtol=1e-5, atol=1e-6)
    assert outs[0].alpha.numel() == int(plan.valid.sum()) > 0
