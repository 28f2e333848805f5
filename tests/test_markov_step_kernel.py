"""The exact greedy Markov stage in one launch per position (models/markov_step_kernel.py): the
kernel against its PyTorch reference, and the reference against the loop of DSparkDraft.draft.

On CUDA the compiled kernel runs; on a CPU, the same kernel under Triton's interpreter
(tests/triton_cpu.py). The kernel sums each r-term product in another order than torch, so
float32 comparisons first check that the chosen logits are no near tie (floats.assert_tie_free).
"""

import pytest
import torch
import torch.nn.functional as F
from floats import assert_tie_free
from triton_cpu import kernel_module

from splitserve.config import EngineConfig
from splitserve.models.markov_step_kernel import markov_greedy_chain_reference
from splitserve.speculative.decode import target_decode
from splitserve.speculative.engine import Engine, SamplingParams
from tests.tiny import VOCAB, tiny_draft, tiny_draft_round, tiny_target

kern, DEV = kernel_module("splitserve.models.markov_step_kernel", "_markov_step_kernel")
pytestmark = pytest.mark.usefixtures("triton_numpy_fix")


def _chain_logits(base, w1, w2, anchor, tokens):
    """U_k + W2 W1[x_{k-1}] along a chain whose tokens are `tokens`: (γ, V) in base's dtype."""
    prev = torch.cat([anchor.view(1), tokens[:-1]])  # (γ,)
    return base + F.linear(F.embedding(prev, w1).to(base.dtype), w2)


def _random_inputs(seed: int, gamma: int, vocab: int, rank: int):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(gamma, vocab, generator=g)  # (γ, V)
    w1 = torch.randn(vocab, rank, generator=g)  # (V, r)
    w2 = torch.randn(vocab, rank, generator=g) * (1.5 / rank**0.5)  # bias ~ N(0, 1.5²): it reorders tokens
    anchor = torch.randint(0, vocab, (), generator=g)
    return base, w1, w2, anchor


def _run_kernel(base, w1, w2, anchor):
    return kern._markov_greedy_chain_op(*(t.to(DEV) for t in (base, w1, w2, anchor))).cpu()


@pytest.mark.parametrize("gamma", [1, 5, 16])
@pytest.mark.parametrize("vocab", [37, 300, 1000])
@pytest.mark.parametrize("rank", [8, 48])
def test_kernel_matches_reference(gamma, vocab, rank):
    moved, chained = 0, 0
    for seed in range(3):
        base, w1, w2, anchor = _random_inputs(seed, gamma, vocab, rank)
        want = markov_greedy_chain_reference(base, w1, w2, anchor)
        assert_tie_free(_chain_logits(base, w1, w2, anchor, want), f"seed {seed}")
        got = _run_kernel(base, w1, w2, anchor)
        assert got.dtype == torch.int64 and got.tolist() == want.tolist(), (seed, got, want)
        # The bias matters (a kernel that dropped it would fail), and each step's bias comes from
        # the token chosen just before (not, say, the anchor at every step).
        moved += int((want != base.argmax(-1)).sum())
        stale = (base + F.linear(F.embedding(anchor.view(1), w1), w2)).argmax(-1)  # (γ,): x_{k-1} = x0 always
        chained += int((want[1:] != stale[1:]).sum())
    assert moved > 0
    assert chained > 0 or gamma == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_ties_pick_the_first_index_as_torch_argmax_does(dtype):
    """Equal maxima in several programs' vocabulary tiles, and zeros of both signs as the maximum:
    the first index wins, as in torch.argmax (which finds -0.0 == +0.0). The bias is 0, or a tiny
    negative one that float16 rounds to -0.0, so that U = -0.0 stays -0.0 into the packing."""
    vocab, rank = 300, 16  # r a power of two: no padding lane adds a +0.0 to the products
    g = torch.Generator().manual_seed(0)
    base = -1.0 - torch.rand(6, vocab, generator=g)  # (γ, V), all below -1
    base[0, [7, 100, 299]] = 3.0  # three programs' tiles
    base[1, [299, 70]] = 2.0
    base[2, [150, 151, 152]] = 0.5
    base[3, 40], base[3, 41], base[3, 200] = -0.0, 0.0, -0.0
    base[4, 90], base[4, 5] = 0.0, -0.0  # -0.0 first in index order
    base[5, :] = 1.25  # all equal
    w1 = torch.full((vocab, rank), 2.0**-16)  # z = W1[x] > 0
    anchor = torch.tensor(3)
    for w2 in (torch.zeros(vocab, rank), torch.full((vocab, rank), -(2.0**-16))):  # bias 0 | -r 2^-32
        args = (base.to(dtype), w1.to(dtype), w2.to(dtype), anchor)
        want = markov_greedy_chain_reference(*args)
        assert want.tolist() == [7, 70, 150, 40, 5, 0]
        assert _run_kernel(*args).tolist() == want.tolist()


def _bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of bfloat16 values at |x| (8 significant bits)."""
    return torch.ldexp(torch.ones_like(x), torch.frexp(x.abs())[1] - 8)


def test_bfloat16_matches_reference_away_from_ties():
    """bfloat16 inputs on chains whose logits have no near tie: each step's best beats its runner-up
    by more than 4 ulps of the row, so neither the summation order nor the rounding direction can
    change a token (Triton 3.6's interpreter truncates float32 to bfloat16; the GPU and torch round
    to nearest even)."""
    gamma, vocab, rank = 6, 300, 48
    tested = moved = 0
    for seed in range(40):
        base, w1, w2, anchor = (t.bfloat16() if t.is_floating_point() else t
                                for t in _random_inputs(seed, gamma, vocab, rank))
        base = base * 2
        want = markov_greedy_chain_reference(base, w1, w2, anchor)
        logits = _chain_logits(base, w1, w2, anchor, want).float()  # (γ, V)
        top2 = logits.topk(2, dim=-1).values
        if ((top2[:, 0] - top2[:, 1]) <= 4 * _bf16_ulp(logits.abs().amax(-1))).any():
            continue
        assert _run_kernel(base, w1, w2, anchor).tolist() == want.tolist(), seed
        tested += 1
        moved += int((want != base.argmax(-1)).sum())
    assert tested >= 5 and moved > 0, (tested, moved)


@pytest.mark.parametrize("dtype, bits", [(torch.bfloat16, 8), (torch.float16, 11)])
def test_rounds_the_product_then_the_sum(dtype, bits):
    """Hand-set, p = the dtype's significant bits: token 70's bias is 1 + 2^-p, which rounds to 1,
    and 2^p + 1 to 2^p: a tie with token 3 (2^p + 0), so the first index wins. Rounding once, after
    the sum, would give 2^p + 2 and token 70; not rounding the sum, 2^p + 1. Both roundings are
    ties whose even neighbour is the lower one, so truncation (Triton 3.6's interpreter turns
    float32 into bfloat16 so) rounds them alike; its float16 rounds to nearest even, as the GPU."""
    vocab, rank = 100, 16
    base = torch.full((1, vocab), -10.0)
    base[0, 3] = base[0, 70] = 2.0**bits
    w1, w2 = torch.zeros(vocab, rank), torch.zeros(vocab, rank)
    w1[5, :2] = 1.0  # z = W1[anchor] = (1, 1, 0, ..)
    w2[70, 0], w2[70, 1] = 1.0, 2.0**-bits
    args = (base.to(dtype), w1.to(dtype), w2.to(dtype), torch.tensor(5))
    assert markov_greedy_chain_reference(*args).tolist() == [3]
    assert _run_kernel(*args).tolist() == [3]


def test_dispatch_falls_back_to_reference_off_cuda():
    base, w1, w2, anchor = _random_inputs(0, 4, 50, 8)
    got = kern.markov_greedy_chain(base, w1, w2, anchor)
    assert got.tolist() == markov_greedy_chain_reference(base, w1, w2, anchor).tolist()


def test_tile_fits_rank():
    for rank in (1, 8, 48, 256, 300, 512, 1024):
        block_v, rb, _ = kern.tile(rank)
        assert rb >= rank and rb & (rb - 1) == 0 and block_v & (block_v - 1) == 0 and block_v * rb <= 16384


# ---- the draft: the kernel's stage against the loop ---------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_draft_with_the_kernel_stage_equals_the_loop(seed):
    draft, ctx, anchor = tiny_draft_round(seed)
    loop, _, conf_loop = draft.draft(ctx, anchor, 13, markov_kernel=False)
    # Off CUDA the dispatcher runs the reference: the loop's ops on the loop's shapes, bit-equal.
    fused, probs, conf = draft.draft(ctx, anchor, 13, markov_kernel=True)
    assert probs is None and fused.tolist() == loop.tolist()
    assert torch.equal(conf, conf_loop)


def test_draft_through_the_kernel_itself_equals_the_loop(monkeypatch):
    """The draft's stage run by the kernel (compiled on CUDA, interpreted on a CPU) on tie-free rounds."""
    calls = []

    def kernel_stage(base, w1, w2, anchor_id):
        calls.append(base.shape)
        return _run_kernel(base, w1, w2, anchor_id)

    monkeypatch.setattr(kern, "markov_greedy_chain", kernel_stage)
    for seed in range(3):
        draft, ctx, anchor = tiny_draft_round(seed)
        loop, _, conf_loop = draft.draft(ctx, anchor, 13, markov_kernel=False)
        with torch.no_grad():
            h = draft.backbone(draft.block_inputs(anchor.view(1)), torch.arange(13, 19)[None], ctx, None)[0]
            assert_tie_free(draft.logits(h, torch.cat([anchor.view(1), loop[:-1]])), f"seed {seed}")
        fused, _, conf = draft.draft(ctx, anchor, 13)
        assert fused.tolist() == loop.tolist()
        torch.testing.assert_close(conf, conf_loop)
    assert len(calls) == 3


@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_heads_whose_latent_needs_more_than_the_previous_token_keep_the_loop(head, monkeypatch):
    def refuse(*args):
        raise AssertionError("the fused stage serves vanilla heads only")

    monkeypatch.setattr(kern, "markov_greedy_chain", refuse)
    draft, ctx, anchor = tiny_draft_round(1, head)
    tokens, _, _ = draft.draft(ctx, anchor, 13)
    assert tokens.tolist() == draft.draft(ctx, anchor, 13, markov_kernel=False)[0].tolist()
    # A vanilla head: sampling keeps the loop too, and the greedy round does reach the patch.
    draft, ctx, anchor = tiny_draft_round(1)
    draft.draft(ctx, anchor, 13, temperature=1.0, generator=torch.Generator().manual_seed(0))
    with pytest.raises(AssertionError, match="vanilla heads only"):
        draft.draft(ctx, anchor, 13)


def test_engine_gives_the_target_greedy_output_either_way():
    target = tiny_target(seed=11)
    draft = tiny_draft(target, block_size=6, markov_rank=8)
    torch.nn.init.normal_(draft.markov.w2.weight, std=1.0)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, VOCAB - 1, (7,), generator=g).tolist() for _ in range(2)]
    for on in (True, False):
        engine = Engine(target, draft, EngineConfig(max_context=64, markov_kernel=on))
        for prompt in prompts:
            assert engine.generate(prompt, SamplingParams(max_tokens=20)).tokens == target_decode(target, prompt, 20)
