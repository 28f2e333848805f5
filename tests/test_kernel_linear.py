"""The weight-only linear: its PyTorch reference (target/native/linear.py) and the Triton kernel
(target/native/linear_kernel.py) agree, for bf16-style same-dtype weights and for fp8 weights.

On CUDA the compiled kernel runs; on a CPU, whenever triton is installed, the same kernel runs on
CPU tensors under Triton's interpreter, in float32, so the tolerances are float32's. Shapes are
not multiples of the block sizes and not square, so a masking or layout bug shows.
"""

import pytest
import torch
from floats import assert_float32_close
from triton_cpu import kernel_module

from splitserve.target.native import linear as ref

lk, DEV = kernel_module("splitserve.target.native.linear_kernel", "_product_kernel")
pytestmark = pytest.mark.usefixtures("triton_numpy_fix")




def _weights(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """(N, K) with row magnitudes over 6 decades: a scale on the wrong axis cannot fit them all."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * torch.logspace(-3, 3, n)[:, None]


def _inputs(t: int, n: int, k: int, fp8: bool, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(t, k, generator=g)
    w = torch.randn(n, k, generator=g)
    scale = None
    if fp8:
        w, scale = ref.quantize_fp8(w)
    b = torch.randn(n, generator=g) if bias else None
    return x, w, scale, b


def _on_dev(*tensors):
    return [a.to(DEV) if a is not None else None for a in tensors]


# reference


def test_fp8_reference_is_the_dequantised_matmul():
    x, w8, scale, b = _inputs(3, 100, 72, fp8=True, bias=True)
    want = torch.einsum("tk,nk->tn", x.double(), w8.double()) * scale.double() + b.double()  # (T, N)
    got = ref.linear(x, w8, scale, b)
    assert got.shape == (3, 100) and got.dtype == torch.float32
    assert_float32_close(got, want.float())
    assert ref.linear(x.bfloat16(), w8, scale, b).dtype == torch.bfloat16


def test_quantize_fp8_round_trip_is_bounded_per_row():
    w = _weights(24, 40)
    w8, scale = ref.quantize_fp8(w)
    assert w8.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and scale.shape == (24,)
    assert torch.equal(w8.float().abs().amax(1), torch.full((24,), 448.0))  # each row's absmax is the top
    err = (w8.float() * scale[:, None] - w).abs()
    # e4m3 keeps 3 mantissa bits: rounding moves a normal value by at most 1/16 of itself, a
    # subnormal by half their spacing, 2^-10 of the row's scale.
    bound = w.abs() / 16 + scale[:, None] * 2**-10
    assert (err <= bound).all()
    assert err.max() > 0  # lossy, as the module says
    # The bound has teeth: one scale per column (the wrong axis) flushes the small rows to zero.
    col_scale = w.abs().amax(0) / 448
    col_err = ((w / col_scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * col_scale - w).abs()
    assert not (col_err <= bound).all()


def test_quantize_fp8_zero_row():
    w = _weights(5, 16)
    w[2] = 0
    w8, scale = ref.quantize_fp8(w)
    assert scale[2] == 1 and (w8[2].float() == 0).all()
    x = torch.randn(2, 16)
    y = ref.linear(x, w8, scale)
    assert torch.isfinite(y).all() and (y[:, 2] == 0).all()


def test_bad_arguments_are_named():
    x, w8, scale, _ = _inputs(2, 10, 8, fp8=True, bias=False)
    with pytest.raises(ValueError, match="needs its per-row scale"):
        ref.linear(x, w8)
    with pytest.raises(ValueError, match="only for fp8"):
        ref.linear(x, torch.randn(10, 8), scale)
    with pytest.raises(ValueError, match=r"scale must be \(10,\) float32"):
        ref.linear(x, w8, scale.double())
    with pytest.raises(ValueError, match="w must be"):
        ref.linear(x, torch.randn(10, 8).half())
    with pytest.raises(ValueError, match="x must be"):
        lk.linear_triton(x, torch.randn(10, 9))


# kernel vs reference


@pytest.mark.parametrize("t", [1, 3, 17])
@pytest.mark.parametrize("n, k", [(100, 72), (257, 130)])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_matches_reference(t, n, k, fp8, bias):
    x, w, scale, b = _inputs(t, n, k, fp8, bias, seed=t + n)
    want = ref.linear(x, w, scale, b)
    got = lk.linear_triton(*_on_dev(x, w, scale, b))
    assert got.shape == (t, n) and got.dtype == x.dtype
    assert_float32_close(got.cpu(), want)


@pytest.mark.parametrize("t", [1, 17])
@pytest.mark.parametrize("fp8", [False, True])
def test_split_k_matches_reference(t, fp8):
    """Few N tiles and a long K: the programs split K and a second kernel adds the partial sums."""
    n, k = 40, 9000
    x, w, scale, b = _inputs(t, n, k, fp8, bias=True)
    assert lk.pick_config(t, n, k, w.element_size()).split_k > 1
    got = lk.linear_triton(*_on_dev(x, w, scale, b))
    assert_float32_close(got.cpu(), ref.linear(x, w, scale, b))


def test_kernel_is_not_the_transposed_or_wrong_axis_product():
    """Square here on purpose, where layout bugs still run: the tolerance above rejects them."""
    t, n = 3, 96
    g = torch.Generator().manual_seed(3)
    x = torch.randn(t, n, generator=g)
    w8, scale = ref.quantize_fp8(_weights(n, n))
    got = lk.linear_triton(x.to(DEV), w8.to(DEV), scale.to(DEV)).cpu()
    assert_float32_close(got, ref.linear(x, w8, scale))
    wrong_axis = x @ (w8.float() * scale[None, :]).T
    transposed = x @ (w8.float() * scale[:, None])
    for bad in (wrong_axis, transposed):
        with pytest.raises(AssertionError):
            assert_float32_close(got, bad, rtol=1e-2)


@pytest.mark.parametrize("t", [1, 3])
def test_bf16_activations(t):
    if t > 1 and DEV.type != "cuda":
        pytest.skip("Triton 3.6's interpreter gets tl.dot of bf16 tiles wrong (T > 1 takes tl.dot)")
    x, w8, scale, b = _inputs(t, 100, 72, fp8=True, bias=True)
    x = x.bfloat16()
    want = ref.linear(x, w8, scale, b).float()
    got = lk.linear_triton(x.to(DEV), w8.to(DEV), scale.to(DEV), b.to(DEV))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float().cpu(), want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))


def test_dispatch(monkeypatch):
    """fp8 weights take the kernel for T <= 32; same-dtype weights only when asked; else the reference."""
    x, w8, scale, _ = _inputs(1, 20, 16, fp8=True, bias=False)
    w = torch.randn(20, 16)
    assert torch.equal(lk.linear(x, w8, scale), ref.linear(x, w8, scale))  # CPU tensors: the reference
    took = []
    monkeypatch.setattr(lk, "triton_usable", lambda t: True)
    monkeypatch.setattr(lk, "linear_triton", lambda *a: took.append("triton"))
    monkeypatch.setattr(lk.reference, "linear", lambda *a: took.append("reference"))
    lk.linear(x, w8, scale)
    lk.linear(x, w)
    lk.linear(x, w, prefer_triton=True)
    lk.linear(torch.randn(33, 16), w8, scale)
    assert took == ["triton", "reference", "triton", "reference"]


def test_product_normalises_first_only_for_the_swapped_dot(monkeypatch):
    """At T >= 2 on bf16 or fp8 weights (the swapped dot) `product` runs the RMSNorm kernel and
    hands the product the normalised rows without a norm; at T = 1 the norm stays folded into the
    product."""
    seen = []
    monkeypatch.setattr(lk, "triton_usable", lambda t: True)
    monkeypatch.setattr(lk, "rms_norm", lambda x, w, eps: x * 0 + 7)
    monkeypatch.setattr(lk, "_op", lambda x, w, s, b, norm, res, eps, silu: seen.append(
        (x.shape[0], bool((x == 7).all()), norm is not None)))
    bf = torch.bfloat16
    norm = torch.ones(16, dtype=bf)
    w8, scale = ref.quantize_fp8(torch.randn(8, 16))
    for t in (1, 17):
        lk.product(torch.randn(t, 16, dtype=bf), torch.randn(8, 16, dtype=bf), norm_weight=norm, eps=1e-5)
        lk.product(torch.randn(t, 16, dtype=bf), w8, scale, norm_weight=norm, eps=1e-5)
    lk.product(torch.randn(17, 16, dtype=bf), torch.randn(8, 16, dtype=bf))  # no norm: nothing to run first
    assert seen == [(1, False, True), (1, False, True), (17, True, False), (17, True, False), (17, False, False)]


@pytest.mark.skipif(not hasattr(torch.library, "triton_op"), reason="torch < 2.6 has no torch.library.triton_op")
def test_custom_op_passes_opcheck():
    """The registered op's schema holds, and on CUDA its fake (meta) path, which torch.compile traces.
    Under the interpreter wrap_triton hands back the kernel itself, which cannot run on fake tensors;
    test_schema compares inputs before and after with allclose, which has no fp8 kernel."""
    fake = ("test_faketensor", "test_aot_dispatch_dynamic") if DEV.type == "cuda" else ()
    x, w8, scale, b = _on_dev(*_inputs(2, 20, 16, fp8=True, bias=True))
    op = torch.ops.splitserve.weight_product
    norm, res = torch.rand(16, device=DEV) + 0.5, torch.randn(2, 10, device=DEV)
    torch.library.opcheck(op, (x, torch.randn(20, 16, device=DEV), None, b, None, None, 0.0, False),
                          test_utils=("test_schema", *fake))
    torch.library.opcheck(op, (x, torch.randn(20, 16, device=DEV), None, None, norm, res, 1e-5, True),
                          test_utils=("test_schema", *fake))
    if fake:
        torch.library.opcheck(op, (x, w8, scale, b, None, None, 0.0, False), test_utils=fake)


# the fused products: norm before, SiLU·up and the residual add after


def _fused_inputs(t: int, n: int, k: int, fp8: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k, generator=g) * 3  # the residual stream: not unit scale, so the norm matters
    w = torch.randn(n, k, generator=g) / k**0.5
    scale = None
    if fp8:
        w, scale = ref.quantize_fp8(w)
    norm = 0.5 + torch.rand(k, generator=g)
    return x, w, scale, norm


@pytest.mark.parametrize("t", [1, 5, 17])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("fusion", ["norm", "norm_silu", "add", "all"])
@pytest.mark.parametrize("split", [None, "split", "swap"])
def test_fused_product_matches_reference(t, fp8, fusion, split):
    """Each folded-in piece against the composition of the separate references, with the blocks
    `pick_config` chooses, and with K split over three programs (the reduce kernel then applies
    the epilogue), also with the weight tile as the dot's left operand (T >= 2). On CUDA also
    through `product`, which at T >= 2 normalises with the RMSNorm kernel before the product."""
    n, k = 48, 300
    x, w, scale, norm = _fused_inputs(t, 2 * n, k, fp8, seed=t + 7 * len(fusion))
    use_norm, silu = fusion in ("norm", "norm_silu", "all"), fusion in ("norm_silu", "all")
    add = fusion in ("add", "all")
    residual = torch.randn(t, n if silu else 2 * n, generator=torch.Generator().manual_seed(9)) if add else None
    kw = dict(norm_weight=norm if use_norm else None, eps=1e-5, residual=residual, silu=silu)
    want = ref.product(x, w, scale, **kw)
    cfg = None
    if split:  # 5 K steps of 64 in three splits of 2, 2 and 1
        cfg = lk.Config(1 if t == 1 else 32, 16, 64, 3, 128, t > 1)
        if split == "swap":  # pipelined by the compiler, sums kept transposed
            cfg = cfg._replace(prefetch=False, num_stages=3, swap_ab=True)
    dev = dict(norm_weight=norm.to(DEV) if use_norm else None, eps=1e-5,
               residual=residual.to(DEV) if add else None, silu=silu)
    got = _interpreted(lk, *_on_dev(x, w, scale), dev, cfg)
    assert got.shape == want.shape
    assert_float32_close(got.cpu(), want)
    if not split and DEV.type == "cuda":  # and through the dispatcher and the registered op
        assert_float32_close(lk.product(*_on_dev(x, w, scale), **dev).cpu(), want)


def _interpreted(lk, x, w, scale, kw, cfg=None):
    """The kernel itself, on any device (on CPU tensors the dispatcher would take the reference)."""
    ref.check_product(x, w, scale, None, kw["norm_weight"], kw["residual"], kw["silu"])
    return lk.launch(x, w, scale, None, kw["norm_weight"], kw["residual"], kw["eps"], kw["silu"], cfg=cfg)


def test_fused_product_pieces_have_teeth():
    """A norm without its weight, SiLU on the wrong half, or a missing residual each break the
    tolerance above: the check compares what is folded in, not just the product."""
    t, n, k = 3, 32, 64
    x, w, _, norm = _fused_inputs(t, 2 * n, k, False, seed=1)
    res = torch.randn(t, n)
    got = _interpreted(lk, x.to(DEV), w.to(DEV), None,
                       dict(norm_weight=norm.to(DEV), eps=1e-5, residual=res.to(DEV), silu=True)).cpu()
    assert_float32_close(got, ref.product(x, w, norm_weight=norm, eps=1e-5, residual=res, silu=True))
    wrong = [
        ref.product(x, w, norm_weight=torch.ones(k), eps=1e-5, residual=res, silu=True),
        res + ref.silu_mul(torch.cat(ref.linear(ref.rms_norm(x, norm, 1e-5), w).chunk(2, -1)[::-1], -1)),
        ref.product(x, w, norm_weight=norm, eps=1e-5, silu=True),
    ]
    for bad in wrong:
        with pytest.raises(AssertionError):
            assert_float32_close(got, bad, rtol=1e-2)


def test_fused_product_refuses_bad_shapes():
    x, w = torch.randn(2, 16), torch.randn(20, 16)
    with pytest.raises(ValueError, match="norm_weight must be"):
        ref.product(x, w, norm_weight=torch.ones(8))
    with pytest.raises(ValueError, match="residual must be"):
        ref.product(x, w, residual=torch.randn(2, 20), silu=True)
    with pytest.raises(ValueError, match="even count"):
        ref.product(x, torch.randn(21, 16), silu=True)


@pytest.mark.parametrize("t, mode", [(1, (True, 1, False, False)), (1, (True, 1, True, False)),
                                     (1, (False, 3, True, False)), (17, (True, 1, False, False)),
                                     (17, (False, 3, False, False)), (17, (False, 3, False, True)),
                                     (17, (False, 3, False, False, True)), (17, (True, 1, False, False, True)),
                                     (5, (False, 4, False, True, True))])
def test_every_streaming_mode_matches_reference(t, mode):
    """The ways a program can stream its weights (the next tile held in registers, or the
    compiler's pipelining; the K sum every step or once; at T >= 2 the weight tile on either side
    of the dot) give the same products, over several K steps, with the norm, SiLU and residual
    folded in."""
    n, k = 24, 300
    x, w, _, norm = _fused_inputs(t, 2 * n, k, False, seed=5)
    res = torch.randn(t, n, generator=torch.Generator().manual_seed(6))
    cfg = lk.Config(1 if t == 1 else 32, 8, 64, 1, 320, t > 1, 4, *mode)
    got = lk.launch(x.to(DEV), w.to(DEV), None, None, norm.to(DEV), res.to(DEV), 1e-5, True, cfg=cfg, pdl=False)
    assert_float32_close(got.cpu(), ref.product(x, w, norm_weight=norm, eps=1e-5, residual=res, silu=True))
