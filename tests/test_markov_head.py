"""The Markov head's three forms: a whole teacher-forced block equals drafting it step by step,
and only the rnn form lets a position see tokens before the previous one."""

import pytest
import torch

from splitserve.models.heads import MarkovHead


def _head(kind: str) -> MarkovHead:
    torch.manual_seed(0)
    head = MarkovHead(vocab_size=50, rank=6, hidden_size=12, kind=kind)
    for p in head.parameters():  # W2 starts at zero; make every weight matter
        torch.nn.init.normal_(p, std=0.5)
    return head


@pytest.mark.parametrize("kind", ["vanilla", "gated", "rnn"])
def test_block_latent_equals_stepping_through_the_block(kind):
    head = _head(kind)
    prev = torch.randint(0, 50, (3, 5))  # (B, γ)
    h = torch.randn(3, 5, 12)  # (B, γ, D)
    z_block = head.latent(prev, h)  # (B, γ, r)
    state, zs = head.init_state(h[:, 0]), []
    for k in range(5):
        state, z = head.step(state, prev[:, k], h[:, k])
        zs.append(z)
    torch.testing.assert_close(z_block, torch.stack(zs, dim=1))
    assert z_block.shape == (3, 5, 6)


@pytest.mark.parametrize("kind, sees_earlier", [("vanilla", False), ("gated", False), ("rnn", True)])
def test_only_the_rnn_head_remembers_tokens_before_the_previous_one(kind, sees_earlier):
    head = _head(kind)
    prev = torch.randint(0, 50, (1, 4))
    h = torch.randn(1, 4, 12)
    other = prev.clone()
    other[0, 0] = (prev[0, 0] + 1) % 50  # change x0 only
    a, b = head.latent(prev, h), head.latent(other, h)
    assert not torch.allclose(a[0, 0], b[0, 0])  # position 1 reads x0 in every form
    assert torch.allclose(a[0, 1:], b[0, 1:]) is not sees_earlier  # positions 2.. only through the state


def test_unknown_head_type_is_refused():
    with pytest.raises(ValueError, match="vanilla.*gated.*rnn"):
        MarkovHead(vocab_size=50, rank=6, hidden_size=12, kind="lstm")


def test_packed_training_logits_equal_each_teacher_forced_block(monkeypatch):
    """The training step runs the rnn head along whole packed blocks before picking the trained
    positions: each picked row equals the teacher-forced logits of its own block, computed alone,
    and the head's recurrent weights get a gradient."""
    from tiny import tiny_draft, tiny_target

    from splitserve.config import LossConfig
    from splitserve.records import HiddenRecord
    from splitserve.train import step as step_mod

    target = tiny_target(seed=3)
    draft = tiny_draft(target, block_size=4, markov_rank=8, markov_head_type="rnn")
    torch.nn.init.normal_(draft.markov.w2.weight, std=0.5)
    ids = torch.randint(0, 90, (30,), generator=torch.Generator().manual_seed(2))
    loss_mask = torch.ones(30, dtype=torch.bool)
    loss_mask[:6] = False
    cap = target.capture(ids[None])
    batch = step_mod.collate([HiddenRecord(0, ids, loss_mask, cap.aux[0], cap.final[0])], torch.device("cpu"),
                             torch.float32)
    seen = {}
    real = step_mod.compute_loss
    monkeypatch.setattr(step_mod, "compute_loss", lambda x, cfg: seen.setdefault("x", x) and real(x, cfg))
    packed = step_mod.plan_blocks(draft, batch, 5, torch.Generator().manual_seed(0))
    out, n = step_mod.draft_loss(draft, batch, 5, LossConfig(), None, packed=packed)
    out.total.backward()
    assert draft.markov.joint.weight.grad.abs().sum() > 0

    sel = packed.label_valid[0].nonzero(as_tuple=True)  # (block, slot) of every trained row, in order
    assert n == len(sel[0]) > 0
    with torch.no_grad():
        for row, (blk, slot) in enumerate(zip(*sel)):
            a = int(packed.anchors[0, blk])
            ctx = draft.context_kv(cap.aux[:, :a], torch.arange(a)[None])
            h = draft.backbone(draft.block_inputs(ids[a : a + 1]), torch.arange(a, a + 4)[None], ctx, None)[0]
            prev = ids[a : a + 4].clone()  # [x0, x*_1, x*_2, x*_3], padded past the end like training
            ref = draft.logits(h[: len(prev)], prev)[slot]
            torch.testing.assert_close(seen["x"].draft_logits[row], ref, rtol=1e-4, atol=1e-4)


def test_a_sampled_round_reports_the_distribution_it_drew_each_token_from():
    """T=1 stays lossless with any head as long as the probabilities handed to rejection sampling
    are the ones each token was drawn from (the sampler itself is tested in test_spec_decode).
    For the rnn head these depend on every earlier draft token of the round."""
    from tiny import tiny_draft, tiny_target

    target = tiny_target(seed=6)
    draft = tiny_draft(target, block_size=5, markov_rank=8, markov_head_type="rnn").eval()
    torch.nn.init.normal_(draft.markov.w2.weight, std=1.0)
    ids = torch.randint(0, 90, (1, 12), generator=torch.Generator().manual_seed(4))
    aux = target.capture(ids).aux
    with torch.no_grad():
        ctx = draft.context_kv(aux[:, :11], torch.arange(11)[None])
        tokens, probs, _ = draft.draft(ctx, ids[0, 11], 11, temperature=1.0, generator=torch.Generator().manual_seed(0))
        h = draft.backbone(draft.block_inputs(ids[:, 11]), torch.arange(11, 16)[None], ctx, None)[0]
        prev = torch.cat([ids[0, 11:12], tokens[:-1]])  # the round's own draws as previous tokens
        torch.testing.assert_close(probs, torch.softmax(draft.logits(h, prev).float(), dim=-1))


def test_markov_lr_scale_gives_the_head_its_own_learning_rate():
    from splitserve.config import TrainConfig
    from splitserve.train.backends import PlainBackend, param_groups
    from tests.tiny import tiny_draft, tiny_target

    draft = tiny_draft(tiny_target())
    trainable = {id(p) for p in draft.parameters() if p.requires_grad}
    head = {id(p) for p in draft.markov.parameters()}
    assert head and head < trainable

    one = param_groups(draft, TrainConfig(lr=1e-3))
    assert len(one) == 1 and {id(p) for p in one[0]["params"]} == trainable

    cfg = TrainConfig(lr=1e-3, markov_lr_scale=5.0, warmup_steps=2, max_steps=10)
    rest, markov = param_groups(draft, cfg)
    assert {id(p) for p in markov["params"]} == head and not head & {id(p) for p in rest["params"]}
    assert {id(p) for p in rest["params"]} | head == trainable
    # The schedule (warmup, then cosine) scales both groups alike: the ratio stays 5 at every step.
    backend = PlainBackend(draft, cfg)
    for _ in range(4):
        rest_lr, head_lr = (g["lr"] for g in backend.opt.param_groups)
        assert head_lr == pytest.approx(5.0 * rest_lr) and rest_lr <= 1e-3
        backend.step()
