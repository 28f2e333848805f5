"""The training attention pattern: block positions see only context before their anchor and
their own block, and packed training computes exactly what a draft round computes."""

import torch
from floats import assert_tie_free
from tiny import MASK_ID, tiny_draft, tiny_target

from splitserve.train.packing import pack_blocks, sample_anchors


def _packed(t=24, n=5, gamma=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 90, (2, t), generator=g)
    loss = torch.ones(2, t, dtype=torch.bool)
    lengths = torch.tensor([t, t - 7])
    anchors, valid = sample_anchors(loss, lengths, n, g)
    return ids, loss, lengths, pack_blocks(ids, loss, lengths, anchors, valid, gamma, MASK_ID)


def test_mask_never_sees_context_at_or_after_anchor_nor_other_blocks():
    ids, _, _, p = _packed()
    b, n = p.anchors.shape
    gamma = p.block_ids.shape[1] // n
    t = ids.shape[1]
    for i in range(b):
        for blk in range(n):
            a = int(p.anchors[i, blk])
            for j in range(gamma):
                row = p.mask[i, 0, blk * gamma + j]
                ctx, blocks = row[:t], row[t:].view(n, gamma)
                assert ctx[:a].all() and not ctx[a:].any(), (i, blk, j, a)
                assert blocks[blk].all(), "bidirectional inside the block"
                others = torch.cat([blocks[:blk], blocks[blk + 1 :]])
                assert not others.any(), "never another block"


def test_anchors_respect_lengths_and_labels():
    _, loss, lengths, p = _packed()
    for i in range(2):
        a = p.anchors[i][p.anchor_valid[i]]
        assert (a >= 1).all() and (a + 1 < lengths[i]).all()
    # slot j predicts token a+j+1; labels past the sequence end are invalid
    assert ((p.label_pos == (p.anchors[..., None] + torch.arange(4) + 1).clamp(max=23)) | ~p.label_valid).all()
    assert not (p.label_valid & (p.anchors[..., None] + torch.arange(4) + 1 >= lengths[:, None, None])).any()


def test_block_inputs_are_anchor_then_masks():
    ids, _, _, p = _packed()
    blocks = p.block_ids.view(2, -1, 4)
    assert (blocks[..., 1:] == MASK_ID).all()
    assert (blocks[..., 0] == torch.gather(ids, 1, p.anchors)).all()


def test_outputs_do_not_depend_on_forbidden_positions():
    """Behavioural check of the mask: changing context at/after the anchor changes nothing."""
    target = tiny_target()
    draft = tiny_draft(target, block_size=4).eval()
    ids, loss, lengths, _ = _packed(n=1)
    lengths = torch.tensor([24, 24])
    anchors = torch.tensor([[10], [15]])
    valid = torch.ones(2, 1, dtype=torch.bool)
    p = pack_blocks(ids, loss, lengths, anchors, valid, 4, MASK_ID)
    aux = target.capture(ids).aux
    pos = torch.arange(24).expand(2, 24)
    with torch.no_grad():
        h1 = draft.backbone(p.block_ids, p.block_pos, draft.context_kv(aux, pos), p.mask)
        aux2 = aux.clone()
        aux2[0, 10:] = torch.randn_like(aux2[0, 10:])
        aux2[1, 15:] = torch.randn_like(aux2[1, 15:])
        h2 = draft.backbone(p.block_ids, p.block_pos, draft.context_kv(aux2, pos), p.mask)
        aux3 = aux.clone()
        aux3[0, 9] += 1.0  # context just before the anchor must matter
        h3 = draft.backbone(p.block_ids, p.block_pos, draft.context_kv(aux3, pos), p.mask)
    torch.testing.assert_close(h1, h2)
    assert not torch.allclose(h1[0], h3[0])


def test_packed_training_forward_equals_inference_round():
    """Many anchors packed in one pass give the same block logits as separate draft rounds."""
    target = tiny_target()
    for rank, kind in ((0, "vanilla"), (8, "vanilla"), (8, "rnn")):
        draft = tiny_draft(target, block_size=4, markov_rank=rank, markov_head_type=kind).eval()
        torch.nn.init.normal_(draft.markov.w2.weight, std=0.5) if draft.markov is not None else None
        ids = torch.randint(0, 90, (1, 30), generator=torch.Generator().manual_seed(1))
        loss = torch.ones(1, 30, dtype=torch.bool)
        anchors = torch.tensor([[3, 11, 20]])
        p = pack_blocks(ids, loss, torch.tensor([30]), anchors, torch.ones(1, 3, dtype=torch.bool), 4, MASK_ID)
        aux = target.capture(ids).aux
        with torch.no_grad():
            h = draft.backbone(p.block_ids, p.block_pos, draft.context_kv(aux, torch.arange(30)[None]), p.mask)
            h = h.view(3, 4, -1)
            for blk, a in enumerate(anchors[0].tolist()):
                ctx = draft.context_kv(aux[:, :a], torch.arange(a)[None])
                h_inf = draft.backbone(draft.block_inputs(ids[:, a]), torch.arange(a, a + 4)[None], ctx, None)[0]
                torch.testing.assert_close(h[blk], h_inf, rtol=1e-4, atol=1e-5)
                # The greedy draft round picks argmax of the Markov-corrected logits in sequence
                # (one position at a time there, the whole block here: tie-free, so exact).
                tokens, _, _ = draft.draft(ctx, ids[0, a], a)
                prev = torch.cat([ids[0, a : a + 1], tokens[:-1]])
                logits = draft.logits(h_inf, prev)
                assert_tie_free(logits)
                assert torch.equal(logits.argmax(-1), tokens)


def test_collate_right_pads_records_into_one_batch():
    from splitserve.records import HiddenRecord
    from splitserve.train.step import collate

    g = torch.Generator().manual_seed(0)
    recs = [HiddenRecord(i, torch.randint(0, 90, (n,), generator=g), torch.rand(n, generator=g) < 0.5,
                         torch.randn(n, 6, generator=g), torch.randn(n, 3, generator=g)) for i, n in enumerate((3, 5))]
    batch = collate(recs, torch.device("cpu"), torch.bfloat16)
    assert batch.input_ids.shape == (2, 5) and batch.aux.shape == (2, 5, 6) and batch.final.dtype == torch.bfloat16
    assert batch.lengths.tolist() == [3, 5]
    for i, r in enumerate(recs):
        n = r.num_tokens
        assert torch.equal(batch.input_ids[i, :n], r.input_ids) and torch.equal(batch.loss_mask[i, :n], r.loss_mask)
        # bit-equal: a copy, and the bf16 cast is correctly rounded on every CPU
        assert torch.equal(batch.aux[i, :n], r.aux.to(torch.bfloat16))
        assert torch.equal(batch.final[i, :n], r.final.to(torch.bfloat16))
    # padding: no label, no token, zero features
    assert not batch.loss_mask[0, 3:].any() and not batch.input_ids[0, 3:].any() and not batch.aux[0, 3:].any()


def test_anchor_is_never_an_untrained_token():
    """The last header token precedes the first reply token (x_{a+1} trained) but is not itself
    trained: at inference the anchor is always a token the target produced, so it is no candidate."""
    t = 16
    loss = torch.zeros(1, t, dtype=torch.bool)
    loss[0, 6:10] = True  # reply 1 (header ends at 5)
    loss[0, 13:] = True  # reply 2 (header ends at 12)
    lengths = torch.tensor([t])
    anchors, valid = sample_anchors(loss, lengths, 32, torch.Generator().manual_seed(0))
    picked = set(anchors[valid].tolist())
    # a needs x_a and x_{a+1} trained, and a + 1 inside the sequence
    assert picked == {6, 7, 8, 13, 14}, picked
    assert 5 not in picked and 12 not in picked


def test_supervision_stops_at_the_first_untrained_label():
    """A block crossing a gap in the loss mask (the user turn between two replies) supervises its
    slots up to the gap only: the round could never accept a token past a rejection there."""
    t = 16
    ids = torch.arange(t)[None]
    loss = torch.zeros(1, t, dtype=torch.bool)
    loss[0, 6:10] = True
    loss[0, 11:] = True  # position 10 untrained: a one-token gap
    anchors = torch.tensor([[8]])
    p = pack_blocks(ids, loss, torch.tensor([t]), anchors, torch.ones(1, 1, dtype=torch.bool), 5, MASK_ID)
    # slot j predicts position 9 + j: 9 trained, 10 not, 11..13 trained again but unreachable
    assert p.label_valid[0, 0].tolist() == [True, False, False, False, False]
    # the end of the sequence stops supervision the same way
    p = pack_blocks(ids, torch.ones(1, t, dtype=torch.bool), torch.tensor([12]), torch.tensor([[9]]),
                    torch.ones(1, 1, dtype=torch.bool), 5, MASK_ID)
    assert p.label_valid[0, 0].tolist() == [True, True, False, False, False]
