"""The native decoder's elementwise kernels (target/native/pointwise_kernel.py) agree with their
PyTorch references (target/native/pointwise.py): on CUDA the compiled kernels, on a CPU the same
kernels under Triton's interpreter. Float32 inputs, so a wrong index, axis or rounding point
shows far above the tolerance."""

import pytest
import torch
from floats import assert_float32_close
from triton_cpu import kernel_module

from splitserve.target.native import pointwise as ref

kern, DEV = kernel_module("splitserve.target.native.pointwise_kernel", "_add_rms_norm_kernel")
pytestmark = pytest.mark.usefixtures("triton_numpy_fix")




def _randn(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEV)


@pytest.mark.parametrize("D", [48, 100])
def test_add_rms_norm(D):
    x, r, w = _randn(3, D, seed=1), _randn(3, D, seed=2), 1 + 0.3 * _randn(D, seed=3)
    got_out, got_sum = kern._add_rms_norm_op(x, r, w, 1e-5)
    want_out, want_sum = ref.add_rms_norm(x, r, w, 1e-5)
    assert_float32_close(got_sum, want_sum)
    assert_float32_close(got_out, want_out)
    assert_float32_close(kern._rms_norm_op(x, w, 1e-6), ref.rms_norm(x, w, 1e-6))


@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_and_write(qk_norm):
    T, Hq, Hkv, hd, L = 3, 4, 2, 16, 12
    qkv = _randn(T, (Hq + 2 * Hkv) * hd, seed=4)
    angles = _randn(L, hd // 2, seed=5)  # a different angle at every slot: a wrong row shows
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)  # (L, hd) tables
    qn, kn = (1 + 0.3 * _randn(hd, seed=6), 1 + 0.3 * _randn(hd, seed=7)) if qk_norm else (None, None)
    positions = torch.tensor([7, 2, 9], device=DEV)  # out of order: each token goes to its own slot
    caches = [[_randn(Hkv, L, hd, seed=8), _randn(Hkv, L, hd, seed=9)] for _ in range(2)]
    got = kern._rope_and_write_op(qkv, cos, sin, qn, kn, 1e-6, *caches[0], positions, Hq)
    want = ref.rope_and_write(qkv, cos, sin, qn, kn, 1e-6, *caches[1], positions, Hq)
    assert got.shape == want.shape == (T, Hq, hd)
    assert_float32_close(got, want)
    for g, w in zip(caches[0], caches[1]):
        assert_float32_close(g, w)  # the written slots, and every other slot untouched


def _stored(t, order):
    """t's values in new storage whose dims, outermost first, are t's dims `order`: a view of t's
    shape with other strides."""
    inverse = sorted(range(t.dim()), key=order.index)
    return torch.empty([t.shape[i] for i in order], dtype=t.dtype, device=t.device).permute(inverse).copy_(t)


@pytest.mark.parametrize("k_order, v_order", [((0, 1, 2), (1, 0, 2)), ((0, 2, 1), (0, 2, 1))])
def test_rope_and_write_caches_through_their_own_strides(k_order, v_order, monkeypatch):
    """Caches (Hkv, L, hd) stored otherwise, as decode_attention (which reads them) accepts: v laid
    out unlike k (slot-major), or hd not innermost. A kernel that writes v through k's strides, or
    hd contiguously, lands k/v in other slots and leaves the right ones stale."""
    monkeypatch.setattr(kern, "triton_usable", lambda t: True)  # the dispatcher, as the decoder calls it
    T, Hq, Hkv, hd, L = 3, 4, 2, 16, 12
    qkv = _randn(T, (Hq + 2 * Hkv) * hd, seed=4)
    angles = _randn(L, hd // 2, seed=5)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)  # (L, hd)
    positions = torch.tensor([7, 2, 9], device=DEV)
    want_k, want_v = _randn(Hkv, L, hd, seed=8), _randn(Hkv, L, hd, seed=9)
    got_k, got_v = _stored(want_k, k_order), _stored(want_v, v_order)
    assert got_v.stride() != got_k.stride() or got_k.stride(-1) != 1  # what k's strides with hd innermost miss
    got = kern.rope_and_write(qkv, cos, sin, None, None, 1e-6, got_k, got_v, positions, Hq)
    want = ref.rope_and_write(qkv, cos, sin, None, None, 1e-6, want_k, want_v, positions, Hq)
    assert_float32_close(got, want)
    assert_float32_close(got_k, want_k)  # the written slots, and every other slot untouched
    assert_float32_close(got_v, want_v)


def test_silu_mul():
    gu = _randn(2, 2 * 1100, seed=10)  # F past one block
    assert_float32_close(kern._silu_mul_op(gu), ref.silu_mul(gu))


@pytest.mark.parametrize("family, products", [("qwen3", "triton"), ("mistral-window", "triton"), ("qwen3", "cublas")])
def test_whole_decoder_on_the_kernels(family, products, monkeypatch):
    """Every kernel of the native decoder at once (the elementwise ones, the weight product and
    attention over the cache) against the transformers forward: a prefill, then a verify block
    over the slots it wrote, inside an attention window."""
    from test_native_decoder import VOCAB, _target

    from splitserve.target.native import attention_kernel, linear_kernel
    from splitserve.target.native.target import NativeTarget

    for module in (kern, attention_kernel, linear_kernel):
        monkeypatch.setattr(module, "triton_usable", lambda t: True)  # CPU tensors go to the interpreter
    hf = _target(family)
    hf.model.to(DEV)
    g = torch.Generator().manual_seed(2)
    prompt, block = (torch.randint(0, VOCAB, (1, n), generator=g).to(DEV) for n in (10, 5))
    cache = hf.new_static_cache(40)
    want = [hf.forward_static(prompt, cache, torch.arange(10, device=DEV), window=16),
            hf.forward_static(block, cache, torch.arange(8, 13, device=DEV), window=16)]
    native = NativeTarget(hf, products=products)
    cache = native.new_static_cache(40)
    got = [native.forward_static(prompt, cache, torch.arange(10, device=DEV), window=16),
           native.forward_static(block, cache, torch.arange(8, 13, device=DEV), window=16)]
    for (g_logits, g_cap), (w_logits, w_cap) in zip(got, want):
        assert_float32_close(g_logits, w_logits, rtol=1e-4)
        assert_float32_close(g_cap.aux, w_cap.aux, rtol=1e-4)
