"""What a split job measures about itself, and the end-of-run verdict.

Producers (target ranks) keep `ProducerCounters` and publish them with their heartbeat;
consumers (draft ranks) read theirs from the channel. At every log step the logging draft rank
turns differences of these cumulative counters into rates; at the end `verdict` says which side
limited the run and which split to try next.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class ProducerCounters:
    """Cumulative, per target rank."""

    samples: int = 0
    tokens: int = 0
    bytes: int = 0
    capture_s: float = 0.0  # running the target
    send_wait_s: float = 0.0  # blocked with no credit: the trainers were behind
    in_flight: int = 0  # records sent and not yet handed on by a trainer (now)
    wall_s: float = 0.0  # since this rank started producing
    peak_mem_gib: float = 0.0  # CUDA memory high-water mark of this rank (0 on CPU)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class ConsumerCounters:
    """Cumulative, summed over the draft ranks."""

    samples: int = 0
    tokens: int = 0
    bytes: int = 0
    recv_wait_s: float = 0.0  # trainers blocked waiting for data: the target ranks were behind


@dataclass
class RateWindow:
    """Turns cumulative counters into per-interval rates."""

    n_draft: int
    n_target: int
    _prev_c: ConsumerCounters = field(default_factory=ConsumerCounters)
    _prev_p: dict[int, dict] = field(default_factory=dict)

    def rates(self, wall_s: float, consumed: ConsumerCounters, produced: dict[int, dict]) -> dict[str, float]:
        wall_s = max(wall_s, 1e-9)
        c, pc = consumed, self._prev_c
        out = {
            "split/consumed_samples_per_s": (c.samples - pc.samples) / wall_s,
            "split/consumed_tokens_per_s": (c.tokens - pc.tokens) / wall_s,
            "split/channel_bytes_per_s": (c.bytes - pc.bytes) / wall_s,
            # Fraction of draft-rank time spent waiting for hidden states (0 = never starved).
            "split/trainer_wait_fraction": (c.recv_wait_s - pc.recv_wait_s) / (wall_s * self.n_draft),
        }
        self._prev_c = ConsumerCounters(**asdict(c))
        if produced:
            d_samples = d_tokens = d_wait = d_wall = 0.0
            depth = 0
            for rank, now in produced.items():
                before = self._prev_p.get(rank, {})
                d_samples += now["samples"] - before.get("samples", 0)
                d_tokens += now["tokens"] - before.get("tokens", 0)
                d_wait += now["send_wait_s"] - before.get("send_wait_s", 0.0)
                d_wall += now["wall_s"] - before.get("wall_s", 0.0)
                depth += now["in_flight"]
            out.update({
                "split/produced_samples_per_s": d_samples / wall_s,
                "split/produced_tokens_per_s": d_tokens / wall_s,
                # Fraction of target-rank time spent blocked on credits (0 = never back-pressured).
                "split/producer_wait_fraction": d_wait / d_wall if d_wall > 0 else 0.0,
                "split/queue_depth": float(depth),
            })
            self._prev_p = {r: dict(v) for r, v in produced.items()}
        return out


@dataclass
class Verdict:
    bound: str  # "producer" | "consumer" | "balanced"
    trainer_wait_fraction: float
    producer_wait_fraction: float
    advice: str

    def as_dict(self) -> dict:
        return asdict(self)


def verdict(
    trainer_wait_fraction: float,
    producer_wait_fraction: float,
    n_target: int,
    n_draft: int,
    threshold: float = 0.05,
) -> Verdict:
    """Which side limited the run: trainers starving means more target ranks would help;
    producers blocked on credits means more draft ranks would."""
    split = f"{n_target}+{n_draft}"
    if trainer_wait_fraction > threshold and trainer_wait_fraction >= producer_wait_fraction:
        bound = "producer"
        advice = (f"producer-bound: draft ranks waited {trainer_wait_fraction:.0%} of the time for hidden "
                  f"states. Try {n_target + 1}+{n_draft - 1} (one more target rank)" if n_draft > 1 else
                  f"producer-bound: the draft rank waited {trainer_wait_fraction:.0%} of the time. Add a "
                  f"target rank ({n_target + 1}+{n_draft}), or shorten sequences / capture in bf16")
    elif producer_wait_fraction > threshold:
        bound = "consumer"
        advice = (f"consumer-bound: target ranks were blocked on credits {producer_wait_fraction:.0%} of the "
                  f"time. Try {n_target - 1}+{n_draft + 1} (one more draft rank)" if n_target > 1 else
                  f"consumer-bound: the target rank was blocked {producer_wait_fraction:.0%} of the time. "
                  f"Add a draft rank ({n_target}+{n_draft + 1}) or use fewer anchors per sequence")
    else:
        bound = "balanced"
        advice = f"balanced: neither side waited more than {threshold:.0%} of the time; keep {split}"
    return Verdict(bound, trainer_wait_fraction, producer_wait_fraction, advice)
