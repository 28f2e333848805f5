"""Loss values against hand computation, and gradients against finite differences."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from splitserve.cli import PACKAGE_CONF
from splitserve.config import LossConfig
from splitserve.train import losses
from splitserve.train.losses import (
    BlockGrid,
    LossInputs,
    acceptance_gain,
    compute_loss,
    decay_weights,
    expected_length,
)


def _inputs(p_d, p_t, labels, slots, conf_logits, dtype=torch.float32):
    return LossInputs(
        draft_logits=torch.tensor(p_d, dtype=dtype).log(),
        target_logits=torch.tensor(p_t, dtype=dtype).log(),
        labels=torch.tensor(labels),
        slot=torch.tensor(slots),
        conf_logits=torch.tensor(conf_logits, dtype=dtype),
        block_size=4,
    )


def test_decay_weights_match_paper():
    w = decay_weights(torch.arange(4), 4.0)
    assert torch.allclose(w, torch.tensor([1.0, math.exp(-0.25), math.exp(-0.5), math.exp(-0.75)]))


def test_paper_loss_hand_computed():
    x = _inputs(
        p_d=[[0.5, 0.3, 0.2], [0.1, 0.8, 0.1]],
        p_t=[[0.2, 0.3, 0.5], [0.1, 0.8, 0.1]],
        labels=[0, 1],
        slots=[0, 1],
        conf_logits=[0.0, 0.0],
    )
    out = compute_loss(x, LossConfig())
    w0, w1 = 1.0, math.exp(-1 / 4)
    tv = (0.6 * w0 + 0.0 * w1) / (w0 + w1)  # ||p_d - p_t||_1 = 0.3 + 0 + 0.3
    ce = (-math.log(0.5) * w0 - math.log(0.8) * w1) / (w0 + w1)
    # c = 0.5 at both slots; labels alpha = 1 - 0.3 = 0.7 and 1.0 -> BCE = ln 2 at both
    conf = math.log(2)
    assert math.isclose(float(out.tv), tv, rel_tol=1e-5)
    assert math.isclose(float(out.ce), ce, rel_tol=1e-5)
    assert math.isclose(float(out.conf), conf, rel_tol=1e-5)
    assert math.isclose(float(out.total), 0.1 * ce + 0.9 * tv + 1.0 * conf, rel_tol=1e-5)
    assert torch.allclose(out.alpha, torch.tensor([0.7, 1.0]))


def test_confidence_label_is_detached_and_perfect_head_has_entropy_only():
    # With c = alpha exactly, BCE equals the binary entropy of alpha (its minimum).
    x = _inputs([[0.5, 0.5]], [[0.9, 0.1]], [0], [0], [math.log(0.6 / 0.4)])
    out = compute_loss(x, LossConfig())
    h = -(0.6 * math.log(0.6) + 0.4 * math.log(0.4))
    assert math.isclose(float(out.conf), h, rel_tol=1e-5)


def test_gradients_match_finite_differences():
    torch.manual_seed(0)
    p, v = 5, 7
    draft = torch.randn(p, v, dtype=torch.float64, requires_grad=True)
    conf = torch.randn(p, dtype=torch.float64, requires_grad=True)
    target = torch.randn(p, v, dtype=torch.float64)
    labels = torch.randint(0, v, (p,))
    slots = torch.tensor([0, 1, 2, 3, 0])

    def f(cfg):
        return lambda d, c: compute_loss(LossInputs(d, target, labels, slots, c, block_size=4), cfg).total

    # The confidence label stop-grads alpha, so the draft-logit gradient is checked on CE + TV
    # and the confidence-logit gradient on the full mix (where the label is a constant).
    assert torch.autograd.gradcheck(f(LossConfig(conf_weight=0.0)), (draft, conf), eps=1e-6, atol=1e-5)
    frozen = draft.detach()
    assert torch.autograd.gradcheck(lambda c: f(LossConfig())(frozen, c), (conf,), eps=1e-6, atol=1e-5)


# --------------------------------------------------------------------------- the prefix family

CONF_LOSS = PACKAGE_CONF / "loss"


def _hand_set():
    """V=2, γ=3. Block 7 has all three slots, block 3 is short (its slot 3 is past the end).
    Rows are interleaved to check that grouping goes by block id, not by row order.

        row  block slot  p_d         p_t          tv   alpha
        A1   7     0     [.9, .1]    [.7, .3]     0.4  0.8
        B1   3     0     [.6, .4]    [.5, .5]     0.2  0.9
        A2   7     1     [.5, .5]    [.75, .25]   0.5  0.75
        B2   3     1     [.2, .8]    [.7, .3]     1.0  0.5
        A3   7     2     [.4, .6]    [.6, .4]     0.4  0.8
    """
    x = _inputs(
        p_d=[[0.9, 0.1], [0.6, 0.4], [0.5, 0.5], [0.2, 0.8], [0.4, 0.6]],
        p_t=[[0.7, 0.3], [0.5, 0.5], [0.75, 0.25], [0.7, 0.3], [0.6, 0.4]],
        labels=[0, 0, 1, 1, 0],
        slots=[0, 0, 1, 1, 2],
        conf_logits=[0.0] * 5,
        dtype=torch.float64,
    )
    x.block_size, x.block = 3, torch.tensor([7, 3, 7, 3, 7])
    return x


def _cfg(name: str, **kw) -> LossConfig:
    """A LossConfig from conf/loss/<name>.yaml, as `loss=<name>` composes it."""
    merged = OmegaConf.merge(OmegaConf.structured(LossConfig), OmegaConf.load(CONF_LOSS / f"{name}.yaml"), kw)
    return OmegaConf.to_object(merged)


def test_expected_length_and_weights_hand_computed():
    x = _hand_set()
    # Block 7: P = .8, .8*.75 = .6, .6*.8 = .48 -> E[tau] = 1 + .8 + .6 + .48 = 2.88
    # Block 3 (short): P = .9, .9*.5 = .45 -> E[tau] = 1 + .9 + .45 = 2.35
    tau = (2.88 + 2.35) / 2
    # survival w_k = P_{k-1}, per row A1 B1 A2 B2 A3
    w_surv = [1.0, 1.0, 0.8, 0.9, 0.6]
    # gain dE/d alpha_k. Block 7: 1 + a2 + a2 a3 = 2.35, a1 (1 + a3) = 1.44, a1 a2 = .6
    #                    Block 3: 1 + a2 = 1.5, a1 = .9
    w_gain = [2.35, 1.5, 1.44, 0.9, 0.6]
    tv = torch.tensor([0.4, 0.2, 0.5, 1.0, 0.4], dtype=torch.float64)
    ce = -torch.tensor([0.9, 0.6, 0.5, 0.8, 0.4], dtype=torch.float64).log()

    grid = BlockGrid.of(x)
    a = grid.scatter(torch.tensor([0.8, 0.9, 0.75, 0.5, 0.8], dtype=torch.float64), fill=1.0)
    assert grid.valid.tolist() == [[True, True, False], [True, True, True]]  # block 3 first (sorted ids)
    assert torch.allclose(expected_length(a, grid.valid), torch.tensor([2.35, 2.88], dtype=torch.float64))
    assert torch.allclose(grid.gather(acceptance_gain(a, grid.valid)), torch.tensor(w_gain, dtype=torch.float64))

    for name, w in (("prefix", w_surv), ("prefix_gain", w_gain)):
        w = torch.tensor(w, dtype=torch.float64)
        out = compute_loss(x, _cfg(name))
        assert math.isclose(float(out.tv), float((w * tv).sum() / w.sum()), rel_tol=1e-9), name
        assert math.isclose(float(out.ce), float((w * ce).sum() / w.sum()), rel_tol=1e-9), name
        assert math.isclose(float(out.exp_len), tau, rel_tol=1e-9), name
        assert torch.allclose(out.alpha, torch.tensor([0.8, 0.9, 0.75, 0.5, 0.8], dtype=torch.float64))

    # expected_length: the paper's terms plus acc_weight * (-E[tau] / γ)
    paper = compute_loss(x, LossConfig())
    for acc in (1.0, 0.25):
        out = compute_loss(x, _cfg("expected_length", acc_weight=acc))
        assert math.isclose(float(out.total), float(paper.total) - acc * tau / 3, rel_tol=1e-9)
        assert math.isclose(float(out.tv), float(paper.tv), rel_tol=1e-12)
    assert math.isclose(paper.metrics()["tau_tf"], tau, rel_tol=1e-9)  # logged for every kind


def test_gap_inside_a_block_is_neutral():
    # Slots 1 and 3 present, slot 2 untrained: the empty cell multiplies survival by 1.
    x = _inputs([[0.9, 0.1], [0.4, 0.6]], [[0.7, 0.3], [0.6, 0.4]], [0, 0], [0, 2], [0.0, 0.0], torch.float64)
    x.block_size, x.block = 3, torch.tensor([0, 0])
    out = compute_loss(x, _cfg("prefix"))
    # alpha = .8, .8: E = 1 + .8 + .64; survival weights 1 and .8
    assert math.isclose(float(out.exp_len), 2.44, rel_tol=1e-9)
    assert math.isclose(float(out.tv), (0.4 * 1 + 0.4 * 0.8) / 1.8, rel_tol=1e-9)


def test_gain_is_the_gradient_of_expected_length():
    torch.manual_seed(1)
    a = torch.rand(6, 5, dtype=torch.float64, requires_grad=True)
    valid = torch.rand(6, 5) > 0.3
    a_filled = torch.where(valid, a, torch.ones_like(a))
    (grad,) = torch.autograd.grad(expected_length(a_filled, valid).sum(), a)
    assert torch.allclose(acceptance_gain(a_filled.detach(), valid)[valid], grad[valid])


def _random_blocks(p_blocks=(3, 1, 2), gamma=3, v=5, seed=0):
    """Random float64 inputs: blocks with the given numbers of leading slots (short blocks too)."""
    torch.manual_seed(seed)
    slots = torch.cat([torch.arange(n) for n in p_blocks])
    block = torch.cat([torch.full((n,), i) for i, n in enumerate(p_blocks)])
    p = len(slots)
    draft = torch.randn(p, v, dtype=torch.float64, requires_grad=True)
    conf = torch.randn(p, dtype=torch.float64, requires_grad=True)
    target = torch.randn(p, v, dtype=torch.float64)
    labels = torch.randint(0, v, (p,))
    return draft, conf, target, labels, slots, block, gamma


def test_expected_length_gradients_match_finite_differences():
    draft, conf, target, labels, slots, block, gamma = _random_blocks()

    def f(cfg):
        return lambda d, c: compute_loss(LossInputs(d, target, labels, slots, c, gamma, block), cfg).total

    cfg = _cfg("expected_length")
    # As for the paper loss, the confidence label is a stop-grad alpha: draft logits are checked
    # without the BCE term, confidence logits on the full mix.
    assert torch.autograd.gradcheck(f(_cfg("expected_length", conf_weight=0.0)), (draft, conf), eps=1e-6, atol=1e-5)
    assert torch.autograd.gradcheck(lambda c: f(cfg)(draft.detach(), c), (conf,), eps=1e-6, atol=1e-5)
    # L_acc alone (every other weight zero) is -E[tau]/γ, fully differentiable.
    only_acc = _cfg("expected_length", ce_weight=0.0, tv_weight=0.0, conf_weight=0.0)
    assert torch.autograd.gradcheck(f(only_acc), (draft, conf), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("name,frozen_fn", [("prefix", "survival_before"), ("prefix_gain", "acceptance_gain")])
def test_weighted_gradients_match_finite_differences_with_weights_held(monkeypatch, name, frozen_fn):
    """The weights are stop-grad: the gradient is the one of the loss with the weights held at
    their current values, which finite differences see once the weight function is frozen."""
    draft, conf, target, labels, slots, block, gamma = _random_blocks(seed=2)
    cfg = _cfg(name, conf_weight=0.0)

    def loss(d):
        return compute_loss(LossInputs(d, target, labels, slots, conf.detach(), gamma, block), cfg).total

    (live,) = torch.autograd.grad(loss(draft), draft)
    x0 = LossInputs(draft.detach(), target, labels, slots, None, gamma, block)
    grid = BlockGrid.of(x0)
    tv0 = (draft.detach().softmax(-1) - target.softmax(-1)).abs().sum(-1)
    a0 = grid.scatter(1 - 0.5 * tv0, 1.0)
    frozen = getattr(losses, frozen_fn)(*((a0,) if frozen_fn == "survival_before" else (a0, grid.valid)))
    monkeypatch.setattr(losses, frozen_fn, lambda *_: frozen)
    (held,) = torch.autograd.grad(loss(draft), draft)
    assert torch.allclose(live, held)
    assert torch.autograd.gradcheck(loss, (draft,), eps=1e-6, atol=1e-5)


def test_prefix_with_decay_is_the_paper_loss_and_paper_rejects_prefix_options():
    draft, conf, target, labels, slots, block, gamma = _random_blocks(seed=3)
    x = LossInputs(draft, target, labels, slots, conf, gamma, block)
    paper = compute_loss(x, LossConfig())
    same = compute_loss(x, LossConfig(kind="prefix"))
    assert torch.allclose(paper.total, same.total, rtol=1e-12)
    with pytest.raises(ValueError, match="kind=prefix"):
        compute_loss(x, LossConfig(weighting="survival"))
    with pytest.raises(ValueError, match="LossInputs.block"):
        compute_loss(LossInputs(draft, target, labels, slots, conf, gamma), _cfg("prefix"))


@pytest.mark.parametrize("name", sorted(p.stem for p in CONF_LOSS.glob("*.yaml")))
def test_draft_loss_runs_with_every_loss_config(name):
    """Each conf/loss group through the real training step on a tiny model, with blocks cut
    short by the end of the sequence."""
    from tiny import tiny_draft, tiny_target

    from splitserve.records import HiddenRecord
    from splitserve.train.step import collate, draft_loss

    target = tiny_target(seed=4)
    draft = tiny_draft(target, block_size=4)
    recs = []
    for i, n in enumerate((12, 7)):
        ids = torch.randint(0, 90, (n,), generator=torch.Generator().manual_seed(i))
        mask = torch.zeros(n, dtype=torch.bool)
        mask[3:] = True
        cap = target.capture(ids[None])
        recs.append(HiddenRecord(i, ids, mask, cap.aux[0], cap.final[0]))
    batch = collate(recs, torch.device("cpu"), torch.float32)
    out, n_pos = draft_loss(draft, batch, 8, _cfg(name), torch.Generator().manual_seed(0))
    out.total.backward()
    m = out.metrics()
    assert n_pos > 0 and math.isfinite(m["loss"]) and 1.0 <= m["tau_tf"] <= 5.0
    grads = [p.grad for p in draft.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def _tiny_batch(target):
    from splitserve.records import HiddenRecord
    from splitserve.train.step import collate

    recs = []
    for i, n in enumerate((12, 7, 15)):
        ids = torch.randint(0, 90, (n,), generator=torch.Generator().manual_seed(i))
        mask = torch.zeros(n, dtype=torch.bool)
        mask[3:] = True
        cap = target.capture(ids[None])
        recs.append(HiddenRecord(i, ids, mask, cap.aux[0], cap.final[0]))
    return collate(recs, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("name", ["paper", "dflash_ce", "expected_length_greedy", "prefix_gain"])
@pytest.mark.parametrize("markov_rank", [8, 0])
def test_chunked_rows_give_the_loss_and_gradients_of_all_rows_at_once(name, markov_rank):
    """train.loss_chunk_rows: the vocabulary-wide terms a few rows at a time, each chunk
    recomputed in the backward, give the same loss, metrics and gradients as all rows at once;
    chunks that do not divide the rows, and a chunk larger than all of them, included."""
    from floats import assert_float32_close
    from tiny import tiny_draft, tiny_target

    from splitserve.train.step import draft_loss, plan_blocks

    target = tiny_target(seed=4)
    draft = tiny_draft(target, block_size=4, markov_rank=markov_rank)
    batch = _tiny_batch(target)
    packed = plan_blocks(draft, batch, 8, torch.Generator().manual_seed(0))
    params = [p for p in draft.parameters() if p.requires_grad]

    def run(chunk_rows):
        out, n = draft_loss(draft, batch, 8, _cfg(name), None, packed=packed, chunk_rows=chunk_rows)
        grads = torch.autograd.grad(out.total, params, allow_unused=True)
        return out, n, grads

    ref, n_ref, g_ref = run(0)
    assert n_ref > 7  # more rows than the chunks below
    for chunk_rows in (1, 3, 7, 10_000):
        out, n, grads = run(chunk_rows)
        assert n == n_ref
        assert_float32_close(out.total, ref.total)
        for k, v in ref.metrics().items():
            assert math.isclose(out.metrics()[k], v, rel_tol=1e-5, abs_tol=1e-6), (chunk_rows, k)
        for a, b in zip(grads, g_ref):
            assert (a is None) == (b is None)
            if a is not None:
                assert_float32_close(a, b)


def test_greedy_acceptance_needs_the_mass_among_precomputed_rows():
    from splitserve.train.losses import RowTerms

    x = LossInputs(None, None, torch.tensor([1, 2]), torch.tensor([0, 1]), None, 4, block=torch.tensor([0, 0]),
                   rows=RowTerms(torch.ones(2), torch.ones(2)))
    with pytest.raises(ValueError, match="mass"):
        compute_loss(x, _cfg("expected_length_greedy"))
    assert math.isfinite(float(compute_loss(x, _cfg("prefix")).total))


def test_dflash_ce_is_decayed_cross_entropy_alone():
    """loss=dflash_ce (the paper's DFlash baseline): the decayed CE only, whatever the TV gap or
    a confidence head's logits would add under the paper mix."""
    x = _inputs(
        p_d=[[0.5, 0.3, 0.2], [0.1, 0.8, 0.1]],
        p_t=[[0.2, 0.3, 0.5], [0.6, 0.2, 0.2]],
        labels=[0, 1],
        slots=[0, 1],
        conf_logits=[3.0, -2.0],
    )
    out = compute_loss(x, _cfg("dflash_ce"))
    w0, w1 = 1.0, math.exp(-1 / 4)
    ce = (-math.log(0.5) * w0 - math.log(0.8) * w1) / (w0 + w1)
    assert math.isclose(float(out.total), ce, rel_tol=1e-5)
    assert float(out.tv) > 0.1 and float(out.conf) > 0.1  # logged, not trained on


@pytest.mark.parametrize("block_size,g", [(4, 4.0), (7, 4.0), (8, 4.0), (10, 5.0), (16, 7.0)])
def test_decay_follows_the_block_size_unless_set(block_size, g):
    from splitserve.config import decay_for

    assert decay_for(LossConfig(), block_size) == g
    assert decay_for(LossConfig(decay_gamma=2.5), block_size) == 2.5
    # the loss itself uses it: slot 1 of a γ=16 block weighs exp(-1/7)
    x = _inputs(p_d=[[0.5, 0.5], [0.5, 0.5]], p_t=[[0.5, 0.5], [0.5, 0.5]], labels=[0, 0], slots=[0, 1],
                conf_logits=[0.0, 0.0])
    x.block_size = block_size
    x.labels = torch.tensor([0, 1])
    x.draft_logits = torch.tensor([[0.9, 0.1], [0.3, 0.7]]).log()
    out = compute_loss(x, _cfg("dflash_ce"))
    w1 = math.exp(-1 / g)
    assert math.isclose(float(out.total), (-math.log(0.9) - w1 * math.log(0.7)) / (1 + w1), rel_tol=1e-5)


def test_log_accept_distance_hand_computed_and_its_gradient_is_tv_scaled_by_one_over_alpha():
    """lk_alpha: the distance term is -2 log alpha_k (LK losses' negative log acceptance)."""
    x = _hand_set()
    out = compute_loss(x, _cfg("lk_alpha"))
    alphas = torch.tensor([0.8, 0.9, 0.75, 0.5, 0.8], dtype=torch.float64)
    w = decay_weights(x.slot, 4.0).double()  # g = 4 at γ = 3
    expect = float((w * -2 * alphas.log()).sum() / w.sum())
    assert math.isclose(float(out.tv), expect, rel_tol=1e-9)
    # d(-2 log alpha)/d logits = (1/alpha) * d(tv)/d logits, row by row (alpha = 1 - tv/2).
    draft, conf, target, labels, slots, block, gamma = _random_blocks(seed=5)
    only = dict(ce_weight=0.0, conf_weight=0.0)

    def grad(distance):
        d = draft.detach().clone().requires_grad_(True)
        cfg = _cfg("lk_alpha", distance=distance, **only)
        compute_loss(LossInputs(d, target, labels, slots, conf.detach(), gamma, block), cfg).total.backward()
        return d.grad

    x = LossInputs(draft.detach(), target, labels, slots, conf, gamma, block)
    alpha = compute_loss(x, LossConfig()).alpha
    # both are normalised by the same decay weights, so the rows' ratio is exactly 1/alpha
    torch.testing.assert_close(grad("log_accept"), grad("tv") / alpha[:, None], rtol=1e-9, atol=1e-12)


def test_greedy_acceptance_builds_expected_length_from_the_drafts_mass_on_the_target_argmax():
    x = _hand_set()
    out = compute_loss(x, _cfg("expected_length_greedy"))
    # p_d at argmax p_t per row A1 B1 A2 B2 A3: .9, .6 (tie in p_t: argmax picks index 0), .5, .2, .4
    # block 7: P = .9, .45, .18 -> 2.53; block 3: P = .6, .12 -> 1.72
    assert math.isclose(float(out.exp_len), (2.53 + 1.72) / 2, rel_tol=1e-9)
    # the TV acceptance stays what the confidence head is taught and what metrics report
    assert torch.allclose(out.alpha, torch.tensor([0.8, 0.9, 0.75, 0.5, 0.8], dtype=torch.float64))
    tv_version = compute_loss(x, _cfg("expected_length"))
    assert not math.isclose(float(out.total), float(tv_version.total), rel_tol=1e-3)
    draft, conf, target, labels, slots, block, gamma = _random_blocks(seed=6)
    acc_only = _cfg("expected_length_greedy", ce_weight=0.0, tv_weight=0.0, conf_weight=0.0)
    assert torch.autograd.gradcheck(
        lambda d: compute_loss(LossInputs(d, target, labels, slots, conf.detach(), gamma, block), acc_only).total,
        (draft,), eps=1e-6, atol=1e-5)


def test_paper_kind_refuses_the_prefix_only_distance_and_acceptance():
    x = _hand_set()
    for key, value in (("distance", "log_accept"), ("acceptance", "greedy")):
        with pytest.raises(ValueError, match="kind=prefix"):
            compute_loss(x, LossConfig(**{key: value}))
    with pytest.raises(ValueError, match="loss.distance"):
        compute_loss(x, LossConfig(kind="prefix", distance="kl"))
