"""Split routing and the end-of-run verdict: pure functions, no processes."""

import pytest

from splitserve.config import SplitConfig
from splitserve.split.routing import Roles, Routing, SplitConfigError
from splitserve.split.telemetry import ConsumerCounters, RateWindow, verdict
from splitserve.stream.sources import DataOrder


@pytest.mark.parametrize("n_target, n_draft, batch", [(1, 2, 4), (2, 2, 4), (3, 1, 5), (4, 4, 8), (1, 7, 7)])
def test_every_sample_reaches_its_draft_rank_in_order(n_target, n_draft, batch):
    order = DataOrder(num_samples=11, batch_size=batch, seed=3)
    routing = Routing(order, n_target, n_draft)
    start, stop = 2, 9
    # What each draft rank expects: its slices, step after step.
    expected = {j: [s for step in range(start, stop) for s in routing.consumer_batch(step, j)] for j in range(n_draft)}
    # What the producers send, and to whom.
    sent = {t: [(step, j, s) for step, j, s in routing.producer_items(t, start, stop)] for t in range(n_target)}
    per_consumer = {j: {t: [s for _, jj, s in sent[t] if jj == j] for t in range(n_target)} for j in range(n_draft)}
    for j in range(n_draft):
        # A round-robin fan-in starting at first_producer(start) must rebuild the expected stream.
        queues = {t: list(per_consumer[j][t]) for t in range(n_target)}
        got, t = [], routing.first_producer(start)
        while any(queues.values()):
            got.append(queues[t].pop(0))
            t = (t + 1) % n_target
        assert got == expected[j]
    # The draft slices of one step put together are the single-process batch.
    for step in range(start, stop):
        assert sum((routing.consumer_batch(step, j) for j in range(n_draft)), []) == order.batch(step)


def test_producer_load_is_balanced():
    routing = Routing(DataOrder(100, 8, 0), n_target=3, n_draft=2)
    counts = [sum(1 for _ in routing.producer_items(t, 0, 30)) for t in range(3)]
    assert sum(counts) == 8 * 30 and max(counts) - min(counts) <= 1


def test_roles_resolve_and_refuse_bad_splits():
    roles = Roles.resolve(SplitConfig(num_target_ranks=4), 8)
    assert roles.target_ranks == (0, 1, 2, 3) and roles.draft_ranks == (4, 5, 6, 7)
    assert roles.names()[5] == "draft 1"
    explicit = Roles.resolve(SplitConfig(target_ranks=[7]), 8)
    assert explicit.draft_ranks == tuple(range(7)) and explicit.role_of(7) == "target"
    with pytest.raises(SplitConfigError, match="at least one target rank and one draft rank"):
        Roles.resolve(SplitConfig(num_target_ranks=3), 3)
    with pytest.raises(SplitConfigError, match="outside the world"):
        Roles.resolve(SplitConfig(target_ranks=[0, 9]), 4)
    with pytest.raises(SplitConfigError, match="multiple of the 3 draft ranks"):
        Routing(DataOrder(10, 4, 0), 1, 3)


def test_rates_and_verdict():
    window = RateWindow(n_draft=2, n_target=1)
    producer = {"samples": 10, "tokens": 1000, "send_wait_s": 1.0, "wall_s": 4.0, "in_flight": 3}
    r = window.rates(2.0, ConsumerCounters(samples=8, tokens=800, bytes=4000, recv_wait_s=0.4), {0: producer})
    # exact: Python float arithmetic on values that binary floats hold exactly
    assert r["split/consumed_tokens_per_s"] == 400 and r["split/channel_bytes_per_s"] == 2000
    assert r["split/trainer_wait_fraction"] == pytest.approx(0.1)  # 0.4 s over 2 ranks x 2 s
    assert r["split/producer_wait_fraction"] == pytest.approx(0.25) and r["split/queue_depth"] == 3
    # The next window reports differences only.
    producer2 = {**producer, "samples": 14, "wall_s": 6.0}
    r2 = window.rates(2.0, ConsumerCounters(samples=12, tokens=1200, bytes=6000, recv_wait_s=0.4), {0: producer2})
    assert r2["split/consumed_samples_per_s"] == 2 and r2["split/trainer_wait_fraction"] == 0
    assert r2["split/produced_samples_per_s"] == 2 and r2["split/producer_wait_fraction"] == 0

    assert verdict(0.30, 0.01, n_target=1, n_draft=3).bound == "producer"
    assert "2+2" in verdict(0.30, 0.01, n_target=1, n_draft=3).advice
    assert verdict(0.01, 0.40, n_target=2, n_draft=2).bound == "consumer"
    assert "1+3" in verdict(0.01, 0.40, n_target=2, n_draft=2).advice
    assert verdict(0.02, 0.03, n_target=4, n_draft=4).bound == "balanced"
