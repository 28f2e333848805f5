"""EngineConfig.draft_weight_format="fp8": the engine serves a copy of the draft whose products
(fc, its layers, the lm_head) are weight-only FP8 (speculative/draft_weights.py). The draft only
proposes, so the output stays the target's own: greedy token for token, and at T=1 the target's
distribution."""

import pytest
import torch
import torch.nn.functional as F
from eagle3_tiny import eagle3_draft
from floats import assert_float32_close
from marginals import sample_two_tokens, two_token_marginals
from tiny import tiny_draft, tiny_target

from splitserve.config import EngineConfig
from splitserve.errors import UserError
from splitserve.speculative.decode import SpecDecoder, target_decode
from splitserve.speculative.draft_weights import Fp8Linear, served_draft
from splitserve.speculative.engine import Engine, SamplingParams
from splitserve.target.native import linear_kernel

pytestmark = pytest.mark.usefixtures("one_thread")


def test_an_fp8_product_is_the_linear_of_its_dequantized_weight_within_fp8_rounding():
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(48, 40, bias=False).requires_grad_(False)
    torch.nn.init.normal_(lin.weight, generator=g)
    q = Fp8Linear(lin)
    assert q.w8.dtype == torch.float8_e4m3fn and q.scale.shape == (40,)
    x = torch.randn(2, 3, 48, generator=g)
    assert_float32_close(q(x), F.linear(x, q.dequantized()))
    # e4m3 keeps 3 mantissa bits: each weight within 2^-4 of itself, relative (absmax rows scaled to 448)
    err = (q.dequantized() - lin.weight).abs()
    assert bool((err <= lin.weight.abs() * 2 ** -4 + 1e-6 * lin.weight.abs().amax(1, keepdim=True)).all())
    assert float(err.max()) > 0  # it is rounded


def test_the_served_copy_quantizes_the_products_only_and_leaves_the_draft_alone():
    target = tiny_target(seed=1)
    draft = tiny_draft(target, block_size=4, markov_rank=8, layers=2)
    served = served_draft(draft, "fp8")
    fp8 = {n for n, m in served.named_modules() if isinstance(m, Fp8Linear)}
    per_layer = {f"layers.{i}.{p}" for i in range(2) for p in ("self_attn.q_proj", "self_attn.k_proj",
                                                              "self_attn.v_proj", "self_attn.o_proj",
                                                              "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    assert fp8 == {"fc", "lm_head"} | per_layer
    assert isinstance(served.markov.w2, torch.nn.Linear) and isinstance(served.confidence.proj, torch.nn.Linear)
    assert not any(isinstance(m, Fp8Linear) for m in draft.modules())  # the model itself is untouched
    assert served.embed_tokens is draft.embed_tokens  # the frozen embedding is shared, not copied
    assert served_draft(draft, "model") is draft
    with pytest.raises(UserError, match="draft_weight_format='int4'"):
        served_draft(draft, "int4")


def test_another_family_is_refused_in_one_line():
    target, draft = eagle3_draft()
    with pytest.raises(UserError, match="serves DSpark and DFlash drafts, not a Eagle3Draft"):
        Engine(target, draft, EngineConfig(max_context=32, draft_weight_format="fp8"))


@pytest.mark.parametrize("attention", ["kernel", "sdpa"])
def test_greedy_output_is_the_targets_own_and_the_engine_drafts_as_the_loop(attention):
    """The engine's FP8 rounds give the target's greedy tokens, and the same accepts as the
    reference loop run with the same FP8 copy, whose numbers differ from the original's."""
    target = tiny_target(seed=3)
    torch.manual_seed(1)
    draft = tiny_draft(target, block_size=4, markov_rank=8).eval()
    torch.nn.init.normal_(draft.markov.w2.weight, std=0.5)
    engine = Engine(target, draft, EngineConfig(max_context=64, min_window=8, draft_attention=attention,
                                                draft_weight_format="fp8"))
    quantized = served_draft(draft, "fp8")
    assert isinstance(engine.draft.lm_head, Fp8Linear)  # the engine serves its FP8 copy
    for prompt in ([3, 1, 4, 1, 5, 9, 2, 6], [7, 7, 2], [50, 8, 61, 3, 3, 90, 12, 5, 33, 21]):
        ref = target_decode(target, prompt, 30)
        loop = SpecDecoder(target, quantized).generate(prompt, 30)
        served = engine.generate(prompt, SamplingParams(max_tokens=30))
        assert served.tokens == loop.tokens == ref
        assert served.accepts == loop.accepts, (prompt, served.accepts, loop.accepts)
    ctx = torch.randn(1, 10, draft.arch.aux_dim, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a = draft.context_kv(ctx, torch.arange(10)[None])
        b = quantized.context_kv(ctx, torch.arange(10)[None])
    assert float((a[0][0] - b[0][0]).abs().max()) > 1e-4  # FP8 changed the draft's numbers


def test_the_fp8_context_path_keeps_the_drafts_dtype(monkeypatch):
    """A bf16 draft served in FP8 projects its context (fc, then each layer's k/v) on bf16 rows, as
    the bf16 draft does. Reading `fc.weight.dtype` once dequantized the whole fc every round and
    ran the context products in float32 (on an H100 at the 8B shape, ~1.2 ms more a round)."""
    target = tiny_target(seed=3)
    draft = tiny_draft(target, block_size=4, markov_rank=8, layers=2).eval().to(torch.bfloat16)
    quantized = served_draft(draft, "fp8")
    seen = []
    real = linear_kernel.linear
    monkeypatch.setattr(linear_kernel, "linear", lambda x, *a, **k: seen.append(x.dtype) or real(x, *a, **k))
    aux = torch.randn(1, 5, draft.arch.aux_dim, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    with torch.no_grad():
        kv = quantized.context_kv(aux, torch.arange(5)[None])
    assert seen == [torch.bfloat16] * (1 + 2 * 2)  # fc, then k and v of each of two layers
    assert all(k.dtype == v.dtype == torch.bfloat16 for k, v in kv)
    assert not hasattr(quantized.fc, "weight")  # no attribute to read a dtype from by accident


def test_sampling_matches_target_distribution():
    """T=1 with an FP8 draft: exact marginals of the two tokens after a fixed anchor vs engine
    samples (V=16), as test_serve_engine's."""
    target = tiny_target(seed=5, vocab=16, layers=3, layer_ids=(0, 1))
    with torch.no_grad():
        target.model.lm_head.weight.mul_(0.1)
    draft = tiny_draft(target, block_size=3, markov_rank=4)
    torch.nn.init.normal_(draft.markov.w2.weight, std=1.0)
    prompt, anchor = [1, 2, 3], 7
    p1, p2 = two_token_marginals(target, prompt + [anchor])
    engine = Engine(target, draft, EngineConfig(max_context=16, seed=0, draft_weight_format="fp8"))
    engine._prefill(prompt, 1.0)
    n = 1500
    first, second, _ = sample_two_tokens(engine, len(prompt), anchor, n)
    # 1500 samples: a frequency's std is at most ~0.013; 0.05 is ~4 sigma.
    assert (first / n - p1).abs().max() < 0.05
    assert (second / n - p2).abs().max() < 0.05
