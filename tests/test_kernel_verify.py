"""Triton kernels agree with their PyTorch references exactly: the verify kernels (speculative/verify.py)
and the Markov candidate chain (models/candidate_chain.py).

On CUDA the compiled kernels run; on a CPU, whenever triton is installed, the same kernels run on
CPU tensors under Triton's interpreter (each @triton.jit function's own Python source, executed
with NumPy: the numerics of the kernel as written, not of the GPU's compiled code). Skipped only
where triton is not installed.
"""

import pytest
import torch
from triton_cpu import kernel_module

from splitserve.models.candidate_chain import chain_argmax_reference
from splitserve.speculative import verify as ref

chain, DEV = kernel_module("splitserve.models.candidate_chain_kernel", "_chain_kernel")
kernels, _ = kernel_module("splitserve.speculative.verify_kernel", "_chunk_argmax_kernel")
pytestmark = pytest.mark.usefixtures("triton_numpy_fix")




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
