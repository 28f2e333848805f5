"""Attention over the static KV cache (target/native/): the PyTorch reference against a naive
per-head loop, and the Triton kernel against the reference.

On CUDA the compiled kernel runs; on a CPU, whenever triton is installed, it runs on CPU tensors
under Triton's interpreter (see tests/test_kernel_verify.py). Skipped only where triton is not
installed (the reference tests need no triton, but share the file's skip to keep one setup).
"""

import pytest
import torch
from triton_cpu import kernel_module

from splitserve.target.native import attention as ref

kernels, DEV = kernel_module("splitserve.target.native.attention_kernel", "_split_kernel")

pytestmark = pytest.mark.usefixtures("one_thread", "triton_numpy_fix")




HUGE = 1e4  # in slots no query may read: any leak shows as an error of this size


def _inputs(T, Hkv, G, hd, L, window, last, seed=0, fused=False):
    """Queries at positions last-T+1..last (a verify block; T=1 is decode) over a cache whose
    slots above `last` (stale) and from `window` on (outside the window) hold HUGE."""
    g = torch.Generator().manual_seed(seed)
    Hq = Hkv * G
    if fused:  # q as the fused qkv projection's output hands it: rows of (Hq + 2*Hkv) * hd
        qkv = torch.randn(T, (Hq + 2 * Hkv) * hd, generator=g)
        q = qkv[:, :Hq * hd].view(T, Hq, hd)
        assert T == 1 or not q.is_contiguous()
    else:
        q = torch.randn(T, Hq, hd, generator=g)
    k = torch.randn(Hkv, L, hd, generator=g)
    v = torch.randn(Hkv, L, hd, generator=g)
    for c in (k, v):
        c[:, last + 1:] = HUGE
    positions = torch.arange(last - T + 1, last + 1)
    return q, k, v, positions


def _naive(q, k, v, positions, window, scale, sliding_window=None):
    """One head at a time, K/V repeated to the query heads, float32 softmax over a -inf mask."""
    T, Hq, hd = q.shape
    G = Hq // k.shape[0]
    k, v = k.repeat_interleave(G, 0)[:, :window].float(), v.repeat_interleave(G, 0)[:, :window].float()
    slots = torch.arange(window)
    out = torch.empty(T, Hq, hd)
    for h in range(Hq):
        scores = q[:, h].float() @ k[h].T * scale  # (T, W)
        visible = slots[None] <= positions[:, None]
        if sliding_window is not None:
            visible &= slots[None] > positions[:, None] - sliding_window
        scores = scores.masked_fill(~visible, float("-inf"))
        out[:, h] = torch.softmax(scores, -1) @ v[h]
    return out


@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("G", [1, 3, 4])
@pytest.mark.parametrize("sliding_window", [None, 7])
def test_reference_matches_naive(T, G, sliding_window):
    hd, L, window = 16, 48, 40
    for last in (T - 1, 20, window - 1):  # the first block, one in the middle, the window's end
        q, k, v, positions = _inputs(T, 2, G, hd, L, window, last, seed=last)
        k[:, window:] = v[:, window:] = HUGE  # outside the window, even where no query is stale
        got = ref.decode_attention(q, k, v, positions, window, hd**-0.5, sliding_window)
        want = _naive(q, k, v, positions, window, hd**-0.5, sliding_window)
        assert got.shape == q.shape and got.dtype == q.dtype
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_reference_chunks_long_inputs(monkeypatch):
    """A prefill too long for one mask goes through several SDPA calls, with the same result."""
    q, k, v, positions = _inputs(23, 2, 3, 16, 64, 64, 40)
    want = _naive(q, k, v, positions, 64, 0.25)
    monkeypatch.setattr(ref, "MASK_ENTRIES", 3 * 64 * 5)  # 5 queries per call
    torch.testing.assert_close(ref.decode_attention(q, k, v, positions, 64, 0.25), want, rtol=1e-5, atol=1e-5)


KERNEL_CASES = [  # (hd, T, G, window, sliding_window, num_splits)
    (64, 1, 1, 40, None, None),
    (64, 1, 3, 300, None, None),
    (64, 1, 4, 300, 16, None),
    (64, 17, 3, 40, 16, None),
    (64, 17, 1, 300, None, 2),  # splits of several tiles: the online softmax across tiles
    (64, 17, 4, 300, 16, 2),
    (128, 1, 4, 40, 16, None),
    (128, 1, 1, 300, 16, None),
    (128, 17, 3, 300, None, None),
    (128, 17, 4, 40, None, None),
    (128, 17, 1, 300, 16, 1),  # one split over five tiles
    (128, 1, 3, 300, None, 3),
    (64, 33, 4, 40, None, None),  # 132 rows: two row blocks of 128
    (256, 5, 2, 100, 16, None),
]


@pytest.mark.parametrize("hd, T, G, window, sliding_window, num_splits", KERNEL_CASES)
@pytest.mark.parametrize("fused", [False, True])
def test_kernel_matches_reference(hd, T, G, window, sliding_window, num_splits, fused):
    L = window + 8  # slots window..L-1 hold HUGE
    # The window's end, and a block early in a long window (most tiles skipped, stale slots above).
    for last in sorted({window - 1, min(T + 20, window - 1)}):
        q, k, v, positions = _inputs(T, 2, G, hd, L, window, last, seed=last, fused=fused)
        k[:, window:] = v[:, window:] = HUGE
        want = ref.decode_attention(q, k, v, positions, window, hd**-0.5, sliding_window)
        got = kernels.decode_attention_triton(q.to(DEV), k.to(DEV), v.to(DEV), positions.to(DEV), window,
                                              hd**-0.5, sliding_window, num_splits=num_splits)
        assert got.shape == q.shape and got.dtype == q.dtype
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("hd, G", [(64, 2), (256, 4)], ids=["hd64", "gemma3-270m"])
@pytest.mark.parametrize("num_splits", [None, 3])
@pytest.mark.parametrize("expanded", [False, True])
def test_kernel_serves_a_draft_block_that_sees_itself_whole(hd, G, num_splits, expanded):
    """The draft's round: γ queries that all read slots 0..last (context, then their whole block),
    with stale slots above `last` in the window. The draft passes its block's last slot expanded
    to every query (models/layers.py, stride 0), so the kernel must read positions through their
    stride: here the memory after that one element holds -1, where nothing is visible. Also at
    Gemma-3-270M's draft shape (hd 256, four query heads on one kv head: 64 rows), whose head
    size takes the kernel's smaller tiles."""
    T, window, last = 16, 300, 250
    q, k, v, _ = _inputs(T, 2, G, hd, window + 8, window, last, seed=1)
    k[:, last + 1:] = v[:, last + 1:] = HUGE
    if expanded:
        slots = torch.full((T + 1,), -1, device=DEV)
        slots[0] = last
        positions = slots[:1].expand(T)
        assert positions.stride(0) == 0
    else:
        positions = torch.full((T,), last, device=DEV)
    want = _naive(q, k, v, positions.cpu(), window, hd**-0.5)
    got = kernels.decode_attention_triton(q.to(DEV), k.to(DEV), v.to(DEV), positions, window, hd**-0.5,
                                          num_splits=num_splits)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)


def test_plan_gives_verify_rows_longer_splits():
    """A verify's full row block takes one program per SM, decode's few rows two: at an 8B shape
    (8 kv heads, hd 128) and a 2048 window, 16 splits of 2 tiles against 32 of 1."""
    cpu = torch.device("cpu")  # the plan assumes an H200's 132 SMs off CUDA
    _, block_kv, _, verify_splits, verify_tiles = kernels.plan(4 * 17, 8, 128, 2048, cpu)
    _, _, _, decode_splits, decode_tiles = kernels.plan(4, 8, 128, 2048, cpu)
    assert (verify_splits, verify_tiles, decode_splits, decode_tiles) == (16, 2, 32, 1)
    assert verify_splits * verify_tiles * block_kv == 2048


@pytest.mark.parametrize("sliding_window", [None, 16])
def test_kernel_reads_no_partial_it_did_not_write(monkeypatch, sliding_window):
    """Splits with no visible slot, and padding rows, store no partial accumulator: the merge must
    not read those entries. The workspaces start as NaN here, so reading one shows."""
    real_empty = torch.empty

    def nan_empty(*shape, dtype=None, device=None, **kw):
        t = real_empty(*shape, dtype=dtype, device=device, **kw)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    T, G, hd, window = 3, 3, 64, 640  # 10 tiles; the queries see the first one only
    q, k, v, positions = _inputs(T, 2, G, hd, window, window, 30)
    want = ref.decode_attention(q, k, v, positions, window, hd**-0.5, sliding_window)
    monkeypatch.setattr(torch, "empty", nan_empty)
    got = kernels.decode_attention_triton(q.to(DEV), k.to(DEV), v.to(DEV), positions.to(DEV), window,
                                          hd**-0.5, sliding_window, num_splits=10)
    monkeypatch.undo()
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype, tol", [
    (torch.float16, 2e-3),
    pytest.param(torch.bfloat16, 2e-2, marks=pytest.mark.skipif(
        DEV.type != "cuda", reason="triton 3.6's interpreter keeps bf16 as uint16 and its tl.dot multiplies the bits")),
])
def test_kernel_16_bit(dtype, tol):
    """16-bit caches: products accumulate in fp32 but the softmax weights are rounded to the cache's
    dtype for the second product (as in FlashAttention), hence the looser tolerance."""
    q, k, v, positions = (x.to(dtype) if x.is_floating_point() else x for x in _inputs(17, 2, 3, 64, 300, 300, 280))
    want = ref.decode_attention(q.float(), k.float(), v.float(), positions, 300, 0.125, 64)
    got = kernels.decode_attention_triton(q.to(DEV), k.to(DEV), v.to(DEV), positions.to(DEV), 300, 0.125, 64)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float().cpu(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("row_tile, num_stages", [(16, 3), (64, None), (32, 4)])
def test_forced_launch_shapes_match_reference(row_tile, num_stages):
    """A row tile smaller than the rows (68 rows of an 8B verify: several row blocks over the same
    K/V) and a deeper pipeline give the reference's result too, as the timing alternatives must."""
    hd, T, G, window = 64, 17, 4, 300
    q, k, v, positions = _inputs(T, 2, G, hd, window + 8, window, window - 1, seed=3)
    k[:, window:] = v[:, window:] = HUGE
    want = ref.decode_attention(q, k, v, positions, window, hd**-0.5)
    got = kernels.decode_attention_triton(q.to(DEV), k.to(DEV), v.to(DEV), positions.to(DEV), window, hd**-0.5,
                                          num_splits=2, row_tile=row_tile, num_stages=num_stages)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)


def test_dispatcher_takes_the_reference_off_cuda_and_for_long_inputs():
    q, k, v, positions = _inputs(kernels.MAX_TRITON_QUERIES + 1, 2, 3, 16, 48, 48, 40)
    want = ref.decode_attention(q, k, v, positions, 48, 0.25)
    torch.testing.assert_close(kernels.decode_attention(q, k, v, positions, 48, 0.25), want, rtol=0, atol=0)


def test_registered_op():
    if not hasattr(torch.library, "triton_op"):
        pytest.skip("torch < 2.6: no triton_op, the kernel launches directly")
    schema = torch.ops.splitserve.decode_attention.default._schema
    assert [a.name for a in schema.arguments] == ["q", "k_cache", "v_cache", "positions", "window", "scale",
                                                  "sliding_window", "num_splits", "row_tile", "num_stages"], schema
    assert not any(a.alias_info for a in schema.arguments), schema  # mutates nothing


@pytest.mark.skipif(DEV.type != "cuda", reason="the interpreter runs kernels eagerly: wrap_triton cannot trace them")
def test_traceable_and_capturable_on_cuda():
    """torch.compile needs the op traceable under fake tensors (its fake implementation is its
    own body); a CUDA graph needs no host sync: one capture serves new positions."""
    from torch.fx.experimental.proxy_tensor import make_fx

    q, k, v, positions = (x.to(DEV) for x in _inputs(3, 2, 3, 64, 256, 256, 40))
    gm = make_fx(lambda *a: kernels.decode_attention(*a, 256, 0.125, 16), tracing_mode="fake")(q, k, v, positions)
    assert any("splitserve.decode_attention" in str(n.target) for n in gm.graph.nodes), gm.graph
    kernels.decode_attention(q, k, v, positions, 256, 0.125)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernels.decode_attention(q, k, v, positions, 256, 0.125)
    for last in (2, 100, 255):
        positions.copy_(torch.arange(last - 2, last + 1))
        graph.replay()
        torch.testing.assert_close(out, ref.decode_attention(q, k, v, positions, 256, 0.125), rtol=1e-4, atol=1e-5)


def test_a_draft_block_through_the_kernel_equals_it_through_sdpa():
    """The model's own call, not a hand-made one: DSpark's cached block (models/layers.py hands the
    kernel its last slot expanded over the queries) through the kernel and through SDPA under the
    context mask give the same hidden states and tokens at every anchor, far into a context."""
    from floats import assert_float32_close, assert_tie_free
    from tiny import tiny_draft, tiny_target

    from splitserve.speculative.drafter import engine_drafter

    target = tiny_target(seed=2, hidden=64)  # head_dim 16, a kernel head size
    torch.manual_seed(0)
    draft = tiny_draft(target, block_size=4, markov_rank=8, layers=2).eval()
    ids = torch.randint(0, 90, (1, 150), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        aux = target.capture(ids).aux.to(DEV)
    draft, ids, cap = draft.to(DEV), ids.to(DEV), 160
    states = {}

    def keep(_m, _i, out):
        states["h"] = out.detach().clone()

    hook = draft.norm.register_forward_hook(keep)
    try:
        for p in (5, 63, 64, 65, 140):  # around a 64-slot K/V tile
            got = {}
            for name, attend in (("kernel", kernels.decode_attention_triton), ("sdpa", None)):
                drafter = engine_drafter(draft, cap, DEV, attend)
                with torch.no_grad():
                    drafter.commit(aux[:, :p], torch.zeros((), dtype=torch.long, device=DEV), ids[0, 1:p + 1], p - 1)
                    if DEV.type == "cuda":  # -1 in the freed small blocks the block's positions will reuse
                        junk = [torch.full((64,), -1, device=DEV) for _ in range(256)]
                        del junk
                    tokens = drafter.propose(ids[0, p], torch.tensor(p, device=DEV), window=cap)[0]
                got[name] = (states["h"], tokens)
            (h_k, t_k), (h_s, t_s) = got["kernel"], got["sdpa"]
            assert torch.isfinite(h_k).all(), p
            assert_float32_close(h_k.cpu(), h_s.cpu())
            with torch.no_grad():  # the block's greedy chain: each slot after the anchor's previous token
                assert_tie_free(draft.logits(h_s[0], torch.cat([ids[0, p:p + 1], t_s[:-1]])))
            assert torch.equal(t_k, t_s), (p, t_k, t_s)
    finally:
        hook.remove()
