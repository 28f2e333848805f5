"""The float32 tolerance of floats.py is meaningful, on the very comparison of test_export's
round trip (the HF-wrapped draft's logits vs the draft's own): kernel-sized drift passes, a
swapped weight or a block one position off fails. And its near-tie check refuses near ties."""

import pytest
import test_export as rt  # a module import: its tests are not collected twice
import torch
from floats import assert_float32_close, assert_tie_free

import splitserve  # noqa: F401  (registers the Auto classes)


@pytest.fixture(params=["vanilla", "rnn"])
def sides(tmp_path, request):
    """(target, draft, the HF-wrapped draft loaded back from its export)."""
    from transformers import AutoModel

    target, draft, out = rt.export_tiny(tmp_path / "export", request.param)
    return target, draft, AutoModel.from_pretrained(out).eval()


@torch.no_grad()
def _ulp_drift(model, seed=0):
    """Every float32 weight times (1 + k eps), k uniform in -2..2: what other rounding does."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        k = torch.randint(-2, 3, p.shape, generator=g).to(p.dtype)
        p.mul_(1 + k * torch.finfo(torch.float32).eps)


@pytest.mark.parametrize("drift", ["ulps", "float64"])
def test_kernel_sized_drift_passes(sides, drift):
    target, draft, model = sides
    if drift == "ulps":
        _ulp_drift(model)
        got, want = rt.round_trip_logits(target, draft, model)
    else:  # the wrapper in float64 (norms and RoPE still round through float32), cast back
        got, want = rt.round_trip_logits(target, draft, model.double())
        got = got.float()
    assert not torch.equal(got, want)  # the drift is real
    assert_float32_close(got, want)


@pytest.mark.parametrize("bug", ["two o_proj rows", "gate_proj <-> up_proj"])
def test_a_swapped_weight_fails(sides, bug):
    target, draft, model = sides
    layer = model.model.layers[0]
    with torch.no_grad():
        if bug == "two o_proj rows":
            w = layer.self_attn.o_proj.weight
            w[[0, 1]] = w[[1, 0]]
        else:  # two tensors of one shape, e.g. an export key map that mixes them up
            gate, up = layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight
            tmp = gate.clone()
            gate.copy_(up)
            up.copy_(tmp)
    with pytest.raises(AssertionError):
        assert_float32_close(*rt.round_trip_logits(target, draft, model))


@pytest.mark.parametrize("shift", [1, -1])
def test_a_block_one_position_off_fails(sides, shift):
    target, draft, model = sides
    with pytest.raises(AssertionError):
        assert_float32_close(*rt.round_trip_logits(target, draft, model, anchor_pos=rt.CTX + shift))


def test_near_ties_are_refused():
    assert_tie_free(torch.tensor([[3.0, 1.0, 0.0], [0.0, -1.0, 2.0]]))
    with pytest.raises(AssertionError, match=r"rows \[1\]"):  # a gap of 1e-5 on a scale of 2
        assert_tie_free(torch.tensor([[3.0, 1.0, 0.0], [2.0, 2.0 - 1e-5, 0.0]]))
