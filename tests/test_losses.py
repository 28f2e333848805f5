"""Loss values against hand computation, and gradients against finite differences."""

import math

import torch

from splitserve.config import LossConfig
from splitserve.train.losses import LossInputs, compute_loss, decay_weights


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
