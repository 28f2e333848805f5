"""Accept/reject rules on hand-set distributions."""

import torch

from splitserve.spec.verify import greedy_verify, sampling_verify


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
