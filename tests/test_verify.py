"""Accept/reject rules on hand-set distributions."""

import torch

from splitserve.speculative.verify import greedy_verify, sampling_verify, truncate_probs, verify_block


def _onehot_logits(tokens, v=10):
    logits = torch.zeros(len(tokens), v)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return logits


def test_greedy_verify_partial_full_none():
    q = _onehot_logits([2, 5, 1, 7])  # target argmax at each verify position
    n, bonus = greedy_verify(torch.tensor([2, 5, 3]), q)
    assert (int(n), int(bonus)) == (2, 1)
    n, bonus = greedy_verify(torch.tensor([2, 5, 1]), q)
    assert (int(n), int(bonus)) == (3, 7)
    n, bonus = greedy_verify(torch.tensor([0, 5, 1]), q)
    assert (int(n), int(bonus)) == (0, 2)


def test_greedy_verify_stops_at_first_mismatch_even_if_later_match():
    q = _onehot_logits([2, 5, 1, 7])
    n, bonus = greedy_verify(torch.tensor([2, 4, 1]), q)
    assert (int(n), int(bonus)) == (1, 5)


def _run_sampling(p, q, trials, seed=0):
    """Emulate draft sampling then verification; returns (first tokens, second tokens | n>=1)."""
    g = torch.Generator().manual_seed(seed)
    gamma, v = p.shape
    first, second = [], []
    for _ in range(trials):
        d = torch.stack([torch.multinomial(p[k], 1, generator=g)[0] for k in range(gamma)])
        u = torch.rand(gamma, generator=g)
        e = torch.empty(v).exponential_(generator=g)
        n, nxt = sampling_verify(d, p, q, u, e)
        out = d[: int(n)].tolist() + [int(nxt)]
        first.append(out[0])
        if len(out) > 1:
            second.append(out[1])
    return torch.bincount(torch.tensor(first), minlength=v).float(), torch.bincount(
        torch.tensor(second), minlength=v
    ).float()


def test_sampling_verify_preserves_target_distribution():
    # Draft and target disagree strongly; the emitted tokens must still follow the target.
    p = torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7]])
    q = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    first, second = _run_sampling(p, q, 20000)
    assert (first / first.sum() - q[0]).abs().max() < 0.015
    assert (second / second.sum() - q[1]).abs().max() < 0.02


def test_sampling_verify_accepts_everything_when_draft_equals_target():
    q = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    d = torch.tensor([3, 0])
    n, _ = sampling_verify(d, q[:2], q, torch.full((2,), 0.999), torch.ones(4))
    assert int(n) == 2


def test_sampling_verify_rejects_token_target_never_emits():
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    q = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    n, nxt = sampling_verify(torch.tensor([0]), p, q, torch.tensor([0.0]), torch.ones(4))
    assert int(n) == 0 and int(nxt) == 1  # residual max(0, q - p) puts all mass on token 1


def _truncated_by_hand(probs: list[float], top_k: int, top_p: float) -> torch.Tensor:
    """vLLM's order written out plainly: keep the k largest, renormalise, keep the largest-first
    prefix until its mass reaches top_p, renormalise."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    kept = order[:top_k] if top_k else order
    mass = sum(probs[i] for i in kept)
    out, acc = [0.0] * len(probs), 0.0
    for i in kept:
        if acc >= top_p:
            break
        out[i] = probs[i] / mass
        acc += probs[i] / mass
    total = sum(out)
    return torch.tensor([x / total for x in out])


def test_truncate_probs_matches_the_rule_by_hand():
    probs = [0.05, 0.35, 0.12, 0.25, 0.08, 0.15]
    for top_k, top_p in [(0, 1.0), (4, 1.0), (0, 0.5), (4, 0.8), (2, 0.99), (1, 1.0), (0, 0.01)]:
        got = truncate_probs(torch.tensor([probs, probs]), top_k, top_p)
        want = _truncated_by_hand(probs, top_k, top_p)
        torch.testing.assert_close(got, torch.stack([want, want]))


def test_a_top_p_below_float32_resolution_keeps_the_most_likely_token():
    # 1e-300 is a valid top_p (> 0) that rounds to 0 in float32; the rule still keeps the top token
    probs = torch.tensor([[0.05, 0.35, 0.12, 0.25, 0.08, 0.15]])
    got = truncate_probs(probs, 0, 1e-300)
    torch.testing.assert_close(got, torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0, 0.0]]))


def test_top_k_top_p_sampling_commits_the_truncated_target_distribution():
    """Many rounds of verify_block with hand-set logits, the draft proposing from an untruncated
    distribution that favours tokens the truncation removes: the first and second committed
    tokens follow the truncated target distributions, and removed tokens never appear."""
    v, gamma, trials = 6, 2, 20000
    q_rows = [[0.05, 0.35, 0.12, 0.25, 0.08, 0.15], [0.30, 0.05, 0.20, 0.10, 0.15, 0.20],
              [1 / 6] * 6]
    logits = torch.tensor(q_rows).log()  # (γ+1, V): softmax(logits / 1) = q_rows
    p = torch.tensor([[0.40, 0.05, 0.05, 0.05, 0.05, 0.40], [0.05, 0.60, 0.05, 0.10, 0.10, 0.10]])
    top_k, top_p = 4, 0.8
    g = torch.Generator().manual_seed(0)
    drafts = torch.stack([torch.multinomial(p[k], trials, replacement=True, generator=g) for k in range(gamma)], 1)
    first, second = torch.zeros(v), torch.zeros(v)
    for t in range(trials):
        n, nxt = verify_block(drafts[t], p, logits, 1.0, g, top_k=top_k, top_p=top_p)
        out = drafts[t, : int(n)].tolist() + [int(nxt)]
        first[out[0]] += 1
        if len(out) > 1:
            second[out[1]] += 1
    want1 = _truncated_by_hand(q_rows[0], top_k, top_p)
    want2 = _truncated_by_hand(q_rows[1], top_k, top_p)
    assert first[want1 == 0].sum() == 0 and second[want2 == 0].sum() == 0
    # first: 20000 samples, std <= 0.0036 -> 0.015 is ~4 sigma; second has ~half the samples.
    # The untruncated target would be off by >= 0.05 on some token; a wrong residual by more.
    assert (first / first.sum() - want1).abs().max() < 0.015
    assert (second / second.sum() - want2).abs().max() < 0.025


def test_greedy_ignores_top_k_top_p():
    logits = _onehot_logits([2, 5, 1, 7])
    draft = torch.tensor([2, 5, 3])
    assert [int(x) for x in verify_block(draft, None, logits, 0.0, top_k=1, top_p=0.1)] == [2, 1]
