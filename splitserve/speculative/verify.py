"""Chain verification: how many draft tokens the target accepts, and the bonus token.

Both functions are pure and stay on the device (no .item()); they are the PyTorch reference
that faster kernels must match. Notation: d_1..d_γ draft tokens, q_0..q_γ the target's
distributions at the verify positions (q_{k-1} scores d_k; q_γ follows the last draft token),
p_1..p_γ the draft's (Markov-corrected) distributions the tokens were sampled from.

top_k / top_p: the target distribution is truncated before verification (`truncate_probs`,
vLLM's order: top-k first, then top-p over the renormalised top-k distribution), and
rejection sampling runs against that truncated q. The draft's p needs no truncation: for any
proposal p, P(commit x) = min(p(x), q(x)) + (1 - sum_y min(p(y), q(y))) * r(x), with
r = max(0, q - p) / sum(max(0, q - p)); since sum_y min(p, q) + sum_y max(0, q - p) = 1 that is
min(p, q)(x) + max(0, q - p)(x) = q(x). A token outside q's support has q = 0, so it never
passes the accept test (u p < 0 is false) and gets no residual mass. Truncating p as well would
only raise acceptance; it is not needed for exactness.
"""

from __future__ import annotations

import torch


def at(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """x[n] for a () device index n. Plain x[n] turns n into a Python int (a host sync, and an
    error inside CUDA graph capture); index_select keeps it on the device."""
    return x.index_select(0, n.view(1))[0]


def truncates(vocab: int, top_k: int, top_p: float) -> bool:
    return 0 < top_k < vocab or top_p < 1.0


def truncate_probs(probs: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """probs (..., V) -> the same rows restricted to the k most likely tokens (ties at the k-th
    value kept), then to the smallest most-likely-first set whose renormalised mass reaches
    top_p (the most likely token always stays), renormalised. top_k 0 and top_p 1: unchanged.
    Shapes are fixed and nothing is read on the host (CUDA-graph safe)."""
    if not truncates(probs.shape[-1], top_k, top_p):
        return probs
    if 0 < top_k < probs.shape[-1]:
        kth = probs.topk(top_k, dim=-1).values[..., -1:]  # (..., 1)
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)  # (..., V)
        total = sorted_p.sum(-1, keepdim=True)
        before = (sorted_p.cumsum(-1) - sorted_p) / total  # mass strictly ahead of each token
        # the most likely token's `before` is exactly 0: a top_p that rounds to 0 in float32
        # (1e-300) must still keep it, so compare against the smallest positive float32 at least
        top_p = max(top_p, torch.finfo(torch.float32).tiny)
        keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before < top_p)
        probs = torch.where(keep, probs, torch.zeros_like(probs))
    return probs / probs.sum(-1, keepdim=True)


def target_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """logits (..., V) -> q = truncate(softmax(logits / T)) (..., V), float32; T > 0."""
    return truncate_probs(torch.softmax(logits.float() / temperature, dim=-1), top_k, top_p)


def race_noise(n: int, device: torch.device, generator: torch.Generator | None = None) -> torch.Tensor:
    """(n,) float32 ~ Exp(1): the noise of an exponential race over n tokens (`race_draw`)."""
    return torch.empty(n, device=device).exponential_(generator=generator)


def race_draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """probs (V,) float32, unnormalised allowed -> () a token drawn from probs / sum(probs):
    argmax probs / e with e ~ Exp(1). One draw of V numbers, whatever probs holds, so a CUDA graph
    replays the same sequence of draws; unlike torch.multinomial, no device-side assert on a NaN."""
    return (probs / race_noise(probs.shape[-1], probs.device, generator)).argmax()


def greedy_verify(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_tokens: (γ,), target_logits: (γ+1, V) -> (n_accepted (), bonus ()).

    Accept the longest prefix with d_k == argmax q_{k-1}; the bonus is argmax q_n, so the
    committed tokens d_1..d_n, bonus are exactly what target greedy decoding would produce.
    """
    target_tokens = target_logits.argmax(-1)  # (γ+1,)
    matches = (draft_tokens == target_tokens[:-1]).long()
    n = matches.cumprod(0).sum()
    return n, at(target_tokens, n)


def sampling_verify(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    uniform: torch.Tensor,
    residual_noise: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless rejection sampling (Leviathan et al. 2023; Chen et al. 2023).

    draft_tokens (γ,), draft_probs (γ, V), target_probs (γ+1, V),
    uniform (γ,) ~ U(0,1) for the accept tests, residual_noise (V,) ~ Exp(1) for the final draw.
    Accept d_k with probability min(1, q_{k-1}(d_k) / p_k(d_k)); at the first rejection draw
    from norm(max(0, q_{k-1} - p_k)); if all γ pass, draw the bonus from q_γ. The output is
    then distributed exactly as the target's, whatever the draft.
    Returns (n_accepted (), next token ()).
    """
    gamma = draft_tokens.shape[0]
    idx = torch.arange(gamma, device=draft_tokens.device)
    q = target_probs[idx, draft_tokens]
    p = draft_probs[idx, draft_tokens]
    accepted = (uniform * p < q).long()  # u < q/p without dividing by a small p; q = 0 never passes
    n = accepted.cumprod(0).sum()
    # Distribution of the next token: residual at the rejected slot, or q_γ if none rejected.
    pad = torch.cat([draft_probs, torch.zeros_like(draft_probs[:1])])  # (γ+1, V), p_{γ+1} = 0
    q_n = at(target_probs, n)  # (V,)
    residual = (q_n - at(pad, n)).clamp_min(0)
    # Where q == p exactly the residual is empty; fall back to q (a probability-zero event).
    residual = torch.where(residual.sum() > 0, residual, q_n)
    # Exponential-race sampling: argmax r / e with e ~ Exp(1) draws from r / sum(r).
    nxt = (residual / residual_noise).argmax()
    return n, nxt


def verify_block(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    temperature: float,
    generator: torch.Generator | None = None,
    greedy=greedy_verify,
    sampling=sampling_verify,
    top_k: int = 0,
    top_p: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One round's verification on the device: (n_accepted (), next token ()).

    draft_tokens (γ,), draft_probs (γ, V) or None when greedy, target_logits (γ+1, V).
    At T>0 the target logits become q = truncate(softmax(logits / T), top_k, top_p) (greedy
    ignores top_k / top_p: truncation keeps the argmax) and the random numbers are drawn
    here, in a fixed order, so every caller consumes its generator the same way.
    `greedy` / `sampling` swap in faster implementations of the same signatures (verify_kernel.py).
    """
    if temperature > 0:
        q = target_probs(target_logits, temperature, top_k, top_p)
        u = torch.rand(draft_tokens.shape[0], device=q.device, generator=generator)
        return sampling(draft_tokens, draft_probs, q, u, race_noise(q.shape[-1], q.device, generator))
    return greedy(draft_tokens, target_logits)
