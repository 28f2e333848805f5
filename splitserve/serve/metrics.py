"""Server counters, rendered in the Prometheus text format (GET /metrics). Thread-safe."""

from __future__ import annotations

import threading
from collections import Counter

from splitserve.serve.engine import GenStats

PREFIX = "splitserve"


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()  # by outcome: stop | length | cancelled | error | rejected
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.rounds = 0  # speculative rounds (target verify forwards after the prefill)
        self.accepted = 0  # accepted draft tokens over those rounds
        self.ttft_sum = 0.0
        self.ttft_count = 0
        self.tpot_sum = 0.0  # per-request mean TPOT, summed
        self.tpot_count = 0
        self.queued = 0
        self.running = 0

    def observe(self, stats: GenStats) -> None:
        with self._lock:
            self.requests[stats.finish_reason] += 1
            self.prompt_tokens += stats.prompt_tokens
            self.generation_tokens += len(stats.tokens)
            self.rounds += len(stats.accepts)
            self.accepted += sum(stats.accepts)
            self.ttft_sum += stats.ttft_s
            self.ttft_count += 1
            if stats.tpot_s is not None:
                self.tpot_sum += stats.tpot_s
                self.tpot_count += 1

    def count(self, outcome: str) -> None:
        with self._lock:
            self.requests[outcome] += 1

    def gauge(self, name: str, delta: int) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + delta)

    def render(self) -> str:
        with self._lock:
            tau = (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0
            tpot = self.tpot_sum / self.tpot_count if self.tpot_count else 0.0
            rows = [
                ("requests_total", "counter", "Requests by outcome (stop, length, cancelled, error, rejected).",
                 [(f'{{outcome="{k}"}}', v) for k, v in sorted(self.requests.items())] or [('{outcome="stop"}', 0)]),
                ("prompt_tokens_total", "counter", "Prompt tokens prefilled.", [("", self.prompt_tokens)]),
                ("generation_tokens_total", "counter", "Tokens generated.", [("", self.generation_tokens)]),
                ("spec_rounds_total", "counter", "Speculative rounds (verify forwards).", [("", self.rounds)]),
                ("spec_accepted_tokens_total", "counter", "Draft tokens accepted.", [("", self.accepted)]),
                ("mean_accept_length", "gauge", "Tokens committed per round, bonus included (tau).", [("", tau)]),
                ("time_to_first_token_seconds", "summary", "Time to first token.",
                 [("_sum", self.ttft_sum), ("_count", self.ttft_count)]),
                ("time_per_output_token_seconds", "summary", "Per-request mean time per output token, TTFT excluded.",
                 [("_sum", self.tpot_sum), ("_count", self.tpot_count)]),
                ("mean_time_per_output_token_seconds", "gauge", "Mean of the per-request TPOTs.", [("", tpot)]),
                ("requests_waiting", "gauge", "Requests queued for the engine.", [("", self.queued)]),
                ("requests_running", "gauge", "Requests on the engine (0 or 1).", [("", self.running)]),
            ]
        lines = []
        for name, kind, help_text, samples in rows:
            full = f"{PREFIX}_{name}"
            lines += [f"# HELP {full} {help_text}", f"# TYPE {full} {kind}"]
            lines += [f"{full}{suffix} {value!r}" for suffix, value in samples]
        return "\n".join(lines) + "\n"
