"""Server metrics through prometheus_client (GET /metrics), under vLLM's names and ours.

vLLM's names (`vllm:...`, label model_name) let dashboards and alerts built for vLLM read this
server unchanged; ours (`splitserve_...`) keep what vLLM has no name for (τ, outcomes by kind,
HTTP errors by status). Timings follow vLLM's meaning:
    TTFT   arrival (request parsed) -> first token on the host, queue time included
    ITL    interval between successive commits of one request (one per speculative round, which
           may carry several tokens, as vLLM observes one interval per engine step)
    TPOT   per request, (last token - first token) / (tokens - 1)
    e2e    arrival -> last token
Spec decode: one draft per round of γ proposed tokens; position j counts rounds whose j-th
draft token was accepted. Each server has its own registry, so several servers in one process
(tests) do not collide.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from splitserve.speculative.engine import GenStats

disable_created_metrics()  # no `*_created` series beside every counter (vLLM turns them off too)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Batch 1 on a small target: latencies from well under a millisecond to minutes.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0, 300.0, 600.0)
STEP_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0)
# requests_total{outcome}: what the engine reports, plus rejected (any 4xx) and error (any 5xx)
VLLM_FINISH = {"stop": "stop", "length": "length", "cancelled": "abort"}


class Metrics:
    def __init__(self, model_name: str = "splitserve", gamma: int = 0):
        self.registry = r = CollectorRegistry()
        self.gamma = gamma
        m = ["model_name"]
        self._running = Gauge("vllm:num_requests_running", "Requests on the engine (batch 1: 0 or 1).", m,
                              registry=r).labels(model_name)
        self._waiting = Gauge("vllm:num_requests_waiting", "Requests queued for the engine.", m,
                              registry=r).labels(model_name)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens prefilled.", m, registry=r).labels(model_name)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.", m,
                                         registry=r).labels(model_name)
        self._success = Counter("vllm:request_success", "Finished requests by finish reason.",
                                m + ["finished_reason"], registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Arrival to first token, queue included.", m,
                              buckets=LATENCY_BUCKETS, registry=r).labels(model_name)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Interval between a request's commits.", m,
                             buckets=STEP_BUCKETS, registry=r).labels(model_name)
        self.tpot = Histogram("vllm:time_per_output_token_seconds", "Per request: mean time per output token "
                              "after the first.", m, buckets=STEP_BUCKETS, registry=r).labels(model_name)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Arrival to last token.", m,
                             buckets=LATENCY_BUCKETS, registry=r).labels(model_name)
        self.queue_time = Histogram("vllm:request_queue_time_seconds", "Arrival to the engine starting it.", m,
                                    buckets=LATENCY_BUCKETS, registry=r).labels(model_name)
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Speculative rounds.", m, registry=r).labels(model_name)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.", m,
                                    registry=r).labels(model_name)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.", m,
                                registry=r).labels(model_name)
        self._per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                "Rounds whose draft token at this position was accepted.", m + ["position"],
                                registry=r)
        self._pos = [self._per_pos.labels(model_name, str(j)) for j in range(gamma)]
        self._model = model_name
        # ours
        self._requests = Counter("splitserve_requests", "Requests by outcome (stop, length, cancelled, rejected: "
                                 "any 4xx, error: any 5xx).", ["outcome"], registry=r)
        self._http_errors = Counter("splitserve_http_errors", "Error responses by HTTP status.", ["status"],
                                    registry=r)
        self.rounds = Counter("splitserve_spec_rounds", "Speculative rounds (verify forwards).", registry=r)
        self.round_accepted = Counter("splitserve_spec_accepted_tokens", "Draft tokens accepted.", registry=r)
        self.own_generation = Counter("splitserve_generation_tokens", "Tokens generated.", registry=r)
        tau = Gauge("splitserve_mean_accept_length", "Tokens committed per round, bonus included (tau).", registry=r)
        tau.set_function(self._tau)
        self.running_gauge = Gauge("splitserve_requests_running", "Requests on the engine (0 or 1).", registry=r)
        self.waiting_gauge = Gauge("splitserve_requests_waiting", "Requests queued for the engine.", registry=r)

    def _tau(self) -> float:
        rounds = self.rounds._value.get()
        return (self.round_accepted._value.get() + rounds) / rounds if rounds else 0.0

    def observe(self, stats: GenStats, queue_s: float) -> None:
        """A request the engine finished (or stopped); queue_s: arrival -> engine start."""
        self.count(stats.finish_reason)
        self._success.labels(self._model, VLLM_FINISH.get(stats.finish_reason, stats.finish_reason)).inc()
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.generation_tokens.inc(len(stats.tokens))
        self.own_generation.inc(len(stats.tokens))
        self.queue_time.observe(queue_s)
        if stats.tokens:
            self.ttft.observe(queue_s + stats.ttft_s)
            self.e2e.observe(queue_s + stats.token_times[-1])
        commits = sorted(set(stats.token_times))  # one time per round's commit
        for a, b in zip(commits, commits[1:]):
            self.itl.observe(b - a)
        if stats.tpot_s is not None:
            self.tpot.observe(stats.tpot_s)
        for n in stats.accepts:
            self.drafts.inc()
            self.draft_tokens.inc(self.gamma)
            self.accepted.inc(n)
            self.rounds.inc()
            self.round_accepted.inc(n)
            for j in range(min(n, len(self._pos))):
                self._pos[j].inc()

    def count(self, outcome: str) -> None:
        self._requests.labels(outcome).inc()

    def http_error(self, status: int) -> None:
        self._http_errors.labels(str(status)).inc()
        self.count("rejected" if status < 500 else "error")

    def gauge(self, name: str, delta: int) -> None:
        """name: running | queued."""
        vllm, ours = (self._running, self.running_gauge) if name == "running" else (self._waiting, self.waiting_gauge)
        vllm.inc(delta)
        ours.inc(delta)

    def render(self) -> str:
        return generate_latest(self.registry).decode()
