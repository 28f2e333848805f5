"""Triton kernels agree with their PyTorch references exactly: the verify kernels (speculative/verify.py)
and the Markov candidate chain (models/candidate_chain.py).

On CUDA the compiled kernels run; on a CPU, whenever triton is installed, the same kernels run on
CPU tensors under Triton's interpreter (each @triton.jit function's own Python source, executed
with NumPy: the numerics of the kernel as written, not of the GPU's compiled code). Skipped only
where triton is not installed.
"""

import pytest
import torch

from splitserve.accel import HAS_TRITON
from splitserve.models.candidate_chain import chain_argmax_reference
from splitserve.speculative import verify as ref

if not HAS_TRITON:
    pytest.skip("triton is not installed (pip install triton: its interpreter runs these kernels on a CPU)",
                allow_module_level=True)

from splitserve.models import candidate_chain_kernel as chain  # noqa: E402
from splitserve.speculative import verify_kernel as kernels  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if DEV.type == "cpu":
    from triton.runtime import interpreter

    # tests/conftest.py sets TRITON_INTERPRET=1 on machines without CUDA before anything imports
    # triton: the kernels (and triton.language's own jit helpers such as tl.argmax) are decorated
    # at import, so the switch cannot be thrown later.
    if not isinstance(chain._chain_kernel, interpreter.InterpretedFunction):
        pytest.skip("no CUDA and triton was imported without TRITON_INTERPRET=1", allow_module_level=True)


@pytest.fixture(autouse=True)
def numpy_2_4_scalar_index(monkeypatch):
    """triton <= 3.6's interpreter makes a scalar argument used as a loop bound (range(steps)) an
    int with int(one-element array), which NumPy 2.4 refuses ("only 0-dimensional arrays can be
    converted to Python scalars"); this applies the upstream fix (triton-lang/triton#9171, in 3.7)."""
    if DEV.type == "cuda" or not hasattr(interpreter, "_patch_lang_tensor"):
        return
    patch_tensor = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", patched)


def _cases(seed: int, gamma: int, vocab: int):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(gamma + 1, vocab, generator=g) * 3
    target_tokens = logits.argmax(-1)
    # Draft tokens agree with the target on a random-length prefix, then (usually) disagree.
    n_true = int(torch.randint(0, gamma + 1, (1,), generator=g))
    draft = torch.randint(0, vocab, (gamma,), generator=g)
    draft[:n_true] = target_tokens[:n_true]
    return logits, draft


@pytest.mark.parametrize("gamma, vocab", [(1, 7), (4, 100), (7, 3000), (8, 1024), (15, 2500), (16, 5000)])
def test_greedy_kernel_matches_reference(gamma, vocab):
    for seed in range(6):
        logits, draft = _cases(seed, gamma, vocab)
        if seed == 0:  # exact ties across tiles: the first index must win, as in torch.argmax
            logits[:, 5] = logits[:, -1] = logits.max() + 1
        want = ref.greedy_verify(draft, logits)
        # bit-equal: argmax is comparisons only, and ties follow one documented rule (first index)
        got = kernels.greedy_verify_triton(draft.to(DEV), logits.to(DEV))
        assert [int(x) for x in got] == [int(x) for x in want], (seed, got, want)


@pytest.mark.parametrize("gamma, vocab, trunc", [(1, 5, (0, 1.0)), (3, 64, (0, 1.0)), (7, 3000, (0, 1.0)),
                                                 (16, 1500, (0, 1.0)), (3, 64, (8, 0.9)), (7, 3000, (50, 0.8))])
def test_sampling_kernel_matches_reference(gamma, vocab, trunc):
    """trunc: q truncated by top_k / top_p (zeros outside its support), as verify_block hands it."""
    for seed in range(8):
        g = torch.Generator().manual_seed(seed)
        p = torch.softmax(torch.randn(gamma, vocab, generator=g) * 2, -1)
        q = ref.truncate_probs(torch.softmax(torch.randn(gamma + 1, vocab, generator=g) * 2, -1), *trunc)
        if seed % 3 == 0:  # near-equal draft and target: long accepts and the q_γ draw
            q[:gamma] = p
        draft = torch.stack([torch.multinomial(p[k], 1, generator=g)[0] for k in range(gamma)])
        u = torch.rand(gamma, generator=g)
        e = torch.empty(vocab).exponential_(generator=g)
        want = ref.sampling_verify(draft, p, q, u, e)
        # bit-equal: correctly rounded elementwise ops (*, -, div_rn) and comparisons; the one
        # sum only decides residual > 0, which no order of summing nonnegatives changes
        got = kernels.sampling_verify_triton(*(t.to(DEV) for t in (draft, p, q, u, e)))
        assert [int(x) for x in got] == [int(x) for x in want], (seed, got, want)


def test_dispatch_falls_back_to_reference_off_cuda():
    logits, draft = _cases(0, 4, 50)
    assert [int(x) for x in kernels.greedy_verify(draft, logits)] == [int(x) for x in ref.greedy_verify(draft, logits)]


@pytest.mark.parametrize("gamma, k", [(2, 1), (4, 3), (8, 64), (16, 64), (16, 100)])
def test_chain_kernel_matches_reference(gamma, k):
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        first, vals = torch.randn(k, generator=g), torch.randn(gamma - 1, k, generator=g)
        trans = torch.randn(gamma - 1, k, k, generator=g)
        if seed == 0:  # exact ties: the first index wins
            first[:] = 1.0
            vals[:] = 0.0
            trans[:] = 0.0
        want = chain_argmax_reference(first, vals, trans)
        # bit-equal: one correctly rounded add per step, then argmax (first index on ties)
        got = chain.chain_argmax_triton(first.to(DEV), vals.to(DEV), trans.to(DEV))
        assert got.cpu().tolist() == want.tolist()
