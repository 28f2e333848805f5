"""Greedy drafting through the Markov head over each position's top-K backbone candidates.

The exact greedy stage (DSparkDraft.draft) runs γ dependent steps, each an (r x V) product and
an argmax over V. At batch 1 on a small target that is γ x 3 launches and γ reads of the head's
V x r matrix per round, a visible share of the round.
Keeping only the K largest backbone logits of each position makes every score the chain can
need computable in parallel before it starts:

    first[j]          = U_1[c_1j] + B(x0, c_1j)
    trans[k-1][i, j]  = B(c_{k-1,i} -> c_{k,j})     bias of candidate j at k given candidate i at k-1

one batched (γ-1, K, r) x (γ-1, r, K) product. The chain is then γ argmaxes over K values
(`chain_argmax`: one small kernel on CUDA, candidate_chain_kernel.py beside this file).

It gives the exact stage's tokens whenever each argmax of U_k + B_k lies among U_k's top K
(always when K = V). It is a drafting choice only: greedy verification commits the target's own
tokens whatever the draft proposes, so the output cannot change; only τ can. And it does: a
trained head often lifts a token the backbone ranks far lower, so with a trained γ=16 SmolLM2
draft the time saved per round did not pay for the τ lost (docs/results/engine_h200.md).
It is therefore opt-in (EngineConfig.markov_topk). Heads whose bias depends on the path beyond
the previous token (rnn) keep the exact stage.
Glossary: γ block size, K candidates per position, V vocab, r Markov rank, D draft hidden size.
"""

from __future__ import annotations

import torch

from splitserve.models.heads import MarkovHead


def chain_argmax_reference(first: torch.Tensor, vals: torch.Tensor, trans: torch.Tensor) -> torch.Tensor:
    """first (K,), vals (γ-1, K), trans (γ-1, K, K), all fp32 -> path (γ,) int64 candidate indices:
    path[0] = argmax first, path[k] = argmax_j vals[k-1, j] + trans[k-1, path[k-1], j]."""
    idx = first.argmax()
    path = [idx]
    for k in range(trans.shape[0]):
        idx = (vals[k] + trans[k].index_select(0, idx.view(1))[0]).argmax()
        path.append(idx)
    return torch.stack(path)


def supports_candidates(markov: MarkovHead | None) -> bool:
    """The vanilla and gated biases depend only on (h_k, x_{k-1}): transitions precompute."""
    return markov is not None and markov.joint is None


def candidate_chain(
    markov: MarkovHead, base: torch.Tensor, h: torch.Tensor, anchor_id: torch.Tensor, k: int,
) -> torch.Tensor:
    """base (γ, V) backbone logits U, h (γ, D) backbone states, anchor_id () -> tokens (γ,)."""
    from splitserve.models.candidate_chain_kernel import chain_argmax  # Triton on CUDA, the reference elsewhere

    vals, cand = base.topk(k, dim=-1)  # (γ, K), (γ, K)
    w2c = markov.w2.weight[cand]  # (γ, K, r): B(x, c) = W2[c] . z(x)
    _, z0 = markov.step(None, anchor_id.view(1), h[:1])  # (1, r)
    first = vals[0].float() + (w2c[0] @ z0[0]).float()  # (K,)
    # z for position k+1 under each candidate previous token c_{k,i}: (γ-1, K, r)
    _, z = markov.step(None, cand[:-1], h[1:, None, :].expand(-1, k, -1))
    trans = torch.bmm(z, w2c[1:].transpose(1, 2)).float()  # (γ-1, K, K)
    path = chain_argmax(first, vals[1:].float(), trans)  # (γ,)
    return cand.gather(1, path[:, None])[:, 0]
