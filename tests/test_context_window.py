"""draft.context_window: a DSpark block reads only the last W context positions, trained and
served alike (train/packing.py's mask, the reference drafter's slice, the engine's kernel
sliding window and its mask's lower bound), and the output stays the target's own."""

import json

import pytest
import torch
from floats import assert_tie_free
from tiny import MASK_ID, tiny_draft, tiny_target

from splitserve.config import EngineConfig
from splitserve.errors import UserError
from splitserve.speculative.decode import SpecDecoder, target_decode
from splitserve.speculative.drafter import reference_drafter
from splitserve.speculative.engine import Engine, SamplingParams
from splitserve.train.packing import pack_blocks

pytestmark = pytest.mark.usefixtures("one_thread")
W = 3


def _draft(target, window: int, seed: int = 0):
    torch.manual_seed(seed)
    draft = tiny_draft(target, block_size=4, markov_rank=8, context_window=window).eval()
    torch.nn.init.normal_(draft.markov.w2.weight, std=0.5)
    return draft


def test_the_training_mask_shows_a_block_its_last_w_context_positions():
    ids = torch.randint(0, 90, (1, 20), generator=torch.Generator().manual_seed(0))
    anchors = torch.tensor([[1, 7, 15]])
    p = pack_blocks(ids, torch.ones(1, 20, dtype=torch.bool), torch.tensor([20]), anchors,
                    torch.ones(1, 3, dtype=torch.bool), 4, MASK_ID, context_window=W)
    ctx = p.mask[0, 0, :, :20].view(3, 4, 20)  # (N, γ, T)
    for blk, a in enumerate(anchors[0].tolist()):
        seen = ctx[blk].nonzero()[:, 1].unique().tolist()
        assert seen == list(range(max(0, a - W), a)), (a, seen)


def test_a_windowed_draft_drafts_as_it_was_trained():
    """The packed training forward with the window gives, anchor by anchor, the tokens the
    reference drafter proposes over the committed context; the window changes the states."""
    target = tiny_target(seed=2)
    draft = _draft(target, W)
    ids = torch.randint(0, 90, (1, 30), generator=torch.Generator().manual_seed(1))
    anchors = torch.tensor([[5, 12, 21]])
    aux = target.capture(ids).aux
    masks = {w: pack_blocks(ids, torch.ones(1, 30, dtype=torch.bool), torch.tensor([30]), anchors,
                            torch.ones(1, 3, dtype=torch.bool), 4, MASK_ID, context_window=w) for w in (W, 0)}
    with torch.no_grad():
        ctx = draft.context_kv(aux, torch.arange(30)[None])
        h = {w: draft.backbone(p.block_ids, p.block_pos, ctx, p.mask).view(3, 4, -1) for w, p in masks.items()}
        assert (h[W] - h[0]).abs().max() > 1e-2  # the window hides context the full draft reads
        for blk, a in enumerate(anchors[0].tolist()):
            drafter = reference_drafter(draft)
            drafter.commit(aux[:, :a], 0, ids[0, 1: a + 1], a - 1)  # positions 0..a-1 committed
            tokens, _, _ = drafter.propose(ids[0, a], a)
            prev = torch.cat([ids[0, a: a + 1], tokens[:-1]])
            logits = draft.logits(h[W][blk], prev)
            assert_tie_free(logits)
            assert torch.equal(logits.argmax(-1), tokens), (a, tokens)


@pytest.mark.parametrize("attention", ["kernel", "sdpa"])
def test_the_engine_serves_the_window_as_the_reference_loop_and_stays_exact(attention):
    """The engine's two draft attentions (the kernel's sliding window, the mask's lower bound)
    draft what the reference loop drafts: the same rounds, and the target's own greedy tokens;
    at T=1 the same seeded tokens from both attentions."""
    target = tiny_target(seed=3)
    draft = _draft(target, W, seed=1)
    engine = Engine(target, draft, EngineConfig(max_context=64, min_window=8, draft_attention=attention))
    rounds = 0
    for prompt in ([3, 1, 4, 1, 5, 9, 2, 6], [7, 7, 2], [50, 8, 61, 3, 3, 90, 12, 5, 33, 21]):
        ref = target_decode(target, prompt, 30)
        loop = SpecDecoder(target, draft).generate(prompt, 30)
        served = engine.generate(prompt, SamplingParams(max_tokens=30))
        assert served.tokens == loop.tokens == ref
        assert served.accepts == loop.accepts, (prompt, served.accepts, loop.accepts)
        rounds += len(served.accepts)
    assert rounds > 10
    other = Engine(target, draft, EngineConfig(max_context=64, min_window=8,
                                               draft_attention="sdpa" if attention == "kernel" else "kernel"))
    sampled = SamplingParams(max_tokens=30, temperature=1.0, seed=5)
    a, b = engine.generate([9, 8, 7, 6, 5], sampled), other.generate([9, 8, 7, 6, 5], sampled)
    assert a.tokens == b.tokens and a.accepts == b.accepts


def test_a_negative_window_is_refused(tmp_path):
    target = tiny_target()
    with pytest.raises(UserError, match=r"draft.context_window=-1: must be >= 0"):
        tiny_draft(target, context_window=-1)


def test_a_windowed_run_is_not_exported(tmp_path):
    """vLLM's and SGLang's DSpark read the whole context: exporting would serve another draft."""
    from splitserve.cli import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "draft_arch.json").write_text(json.dumps({"family": "dspark", "arch": {"context_window": 512}}))
    with pytest.raises(SystemExit) as exit_:
        main(["export", str(run), str(tmp_path / "out")])
    assert "trained with draft.context_window=512: vLLM's and SGLang's DSpark read the whole context" \
        in str(exit_.value.code)
