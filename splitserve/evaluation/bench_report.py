"""What `splitserve bench` reports, named and defined as `sglang.bench_serving` and
`vllm bench serve` report it, and the files it writes.

Per request (times from the request's start, on the host):
  TTFT    the first token's arrival
  TPOT    (last token's arrival - TTFT) / (output tokens - 1)
  ITL     one value per output token after the first: each step's gap since the step before,
          spread evenly over the tokens it committed (bench_serving's sglang backend; `vllm bench
          serve` keeps one value per streamed chunk instead, so its ITL of a speculative server is
          about τ times ours)
  E2E     the request's end-to-end latency
Per method: mean / median / p99 of each over all requests (all tokens for ITL; p99 interpolated
as numpy's default), duration (the wall time of the timed requests, one after another), request
throughput and output tok/s over that duration. Speculative methods also get vLLM's
speculative-decoding block, pooled over every round of every request:
  accept length        τ = 1 + accepted draft tokens / rounds (tokens per target forward)
  acceptance rate      accepted draft tokens / (rounds x γ)
  per-position         position k: the share of rounds whose draft token k was accepted
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

MS = 1000.0


@dataclass
class RequestTiming:
    ttft_s: float
    tpot_s: float | None
    latency_s: float
    output_tokens: int
    accept_length: float | None = None  # this request's τ
    rounds: int | None = None  # speculative rounds after the prefill
    itl_s: list[float] = field(default_factory=list)  # one per output token after the first (not in the JSON)
    accepts: list[int] = field(default_factory=list)  # accepted draft tokens per round (not in the JSON)
    start_s: float = 0.0  # perf_counter at the request's start and end: the duration (not in the JSON)
    end_s: float = 0.0


@dataclass
class MethodResult:
    name: str
    num_requests: int = 0
    duration_s: float | None = None
    request_throughput: float | None = None  # requests per second of duration
    output_tok_s: float | None = None
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    median_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    mean_itl_ms: float | None = None
    median_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    mean_e2e_ms: float | None = None
    median_e2e_ms: float | None = None
    p99_e2e_ms: float | None = None
    # speculative methods: pooled over all rounds of all requests (a mean of per-request τ
    # would overweight short replies)
    mean_accept_length: float | None = None
    acceptance_rate: float | None = None
    per_position_acceptance: list[float] | None = None  # k = 1..γ
    rounds: int | None = None
    exact_vs_ar: int | None = None  # requests whose tokens equal the engine's AR output
    note: str | None = None  # why a method was skipped
    requests: list[RequestTiming] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def itls(token_times: list[float]) -> list[float]:
    """Arrival time of each output token -> its ITL: the tokens that arrive together (one step's)
    share the gap since the step before. The first step's tokens have none (their wait is the
    TTFT), as in bench_serving."""
    out, prev, i = [], None, 0
    while i < len(token_times):
        j = i
        while j < len(token_times) and token_times[j] == token_times[i]:
            j += 1
        if prev is not None:
            out += [(token_times[i] - prev) / (j - i)] * (j - i)
        prev, i = token_times[i], j
    return out


def _spread(values: list[float]) -> tuple[float | None, float | None, float | None]:
    """-> (mean, median, p99) in ms, or Nones."""
    if not values:
        return None, None, None
    ms = [v * MS for v in values]
    return statistics.fmean(ms), statistics.median(ms), percentile(ms, 99)


def acceptance(accepts: list[int], gamma: int) -> tuple[float, float, list[float]]:
    """Accepted draft tokens per round -> (τ, acceptance rate, per-position acceptance k = 1..γ)."""
    rounds = len(accepts)
    tau = 1 + sum(accepts) / rounds
    rate = sum(accepts) / (rounds * gamma) if gamma else 0.0
    return tau, rate, [sum(n >= k for n in accepts) / rounds for k in range(1, gamma + 1)]


def summarize(name: str, timings: list[RequestTiming], duration_s: float | None = None, gamma: int = 0,
              input_tokens: int = 0) -> MethodResult:
    """`duration_s`: the wall time of the timed requests (None: first start to last end, as
    bench_serving's; the sum of their latencies where they carry no start and end)."""
    res = MethodResult(name, num_requests=len(timings), requests=timings, total_input_tokens=input_tokens)
    if not timings:
        return res
    res.mean_ttft_ms, res.median_ttft_ms, res.p99_ttft_ms = _spread([t.ttft_s for t in timings])
    res.mean_tpot_ms, res.median_tpot_ms, res.p99_tpot_ms = _spread([t.tpot_s for t in timings if t.tpot_s is not None])
    res.mean_itl_ms, res.median_itl_ms, res.p99_itl_ms = _spread([x for t in timings for x in t.itl_s])
    res.mean_e2e_ms, res.median_e2e_ms, res.p99_e2e_ms = _spread([t.latency_s for t in timings])
    res.total_output_tokens = sum(t.output_tokens for t in timings)
    if duration_s is None and all(t.end_s for t in timings):
        duration_s = max(t.end_s for t in timings) - min(t.start_s for t in timings)
    duration = duration_s if duration_s is not None else sum(t.latency_s for t in timings)
    if duration > 0:
        res.duration_s = duration
        res.request_throughput = len(timings) / duration
        res.output_tok_s = res.total_output_tokens / duration
    accepts = [n for t in timings for n in t.accepts]
    spec = [t for t in timings if t.accept_length is not None and t.rounds]
    if accepts:
        res.mean_accept_length, rate, per_pos = acceptance(accepts, gamma)
        res.acceptance_rate, res.per_position_acceptance = (rate, per_pos) if gamma else (None, None)
        res.rounds = len(accepts)
    elif spec:  # timings without their rounds: τ pooled from each request's own
        res.mean_accept_length = sum(t.accept_length * t.rounds for t in spec) / sum(t.rounds for t in spec)
        res.rounds = sum(t.rounds for t in spec)
    return res


# ---- the table ----------------------------------------------------------------------------

# (label, field, format, higher is better) per row; the speedup column divides so that > 1 is faster
ROWS = [
    ("requests", "num_requests", "d", None),
    ("duration (s)", "duration_s", ".2f", None),
    ("request throughput (req/s)", "request_throughput", ".3f", True),
    ("output tok/s", "output_tok_s", ".1f", True),
    ("mean TTFT (ms)", "mean_ttft_ms", ".2f", False),
    ("median TTFT (ms)", "median_ttft_ms", ".2f", False),
    ("p99 TTFT (ms)", "p99_ttft_ms", ".2f", False),
    ("mean TPOT (ms)", "mean_tpot_ms", ".3f", False),
    ("median TPOT (ms)", "median_tpot_ms", ".3f", False),
    ("p99 TPOT (ms)", "p99_tpot_ms", ".3f", False),
    ("mean ITL (ms)", "mean_itl_ms", ".3f", False),
    ("median ITL (ms)", "median_itl_ms", ".3f", False),
    ("p99 ITL (ms)", "p99_itl_ms", ".3f", False),
    ("mean E2E latency (ms)", "mean_e2e_ms", ".1f", False),
    ("accept length τ", "mean_accept_length", ".3f", None),
    ("acceptance rate", "acceptance_rate", ".3f", None),
]


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_table(results: dict[str, MethodResult], spec: str = "engine spec", ar: str = "engine AR") -> str:
    """Metrics as rows, methods as columns; with both `spec` and `ar` measured, a last column of
    spec's speedup over AR (AR/spec for times, spec/AR for rates). Skipped methods: a line each."""
    shown = [r for r in results.values() if not r.note]
    s, a = results.get(spec), results.get(ar)
    pair = s is not None and a is not None and not s.note and not a.note
    head = ["metric"] + [r.name for r in shown] + (["speedup vs AR"] if pair else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, key, fmt, higher in ROWS:
        cells = [_cell(getattr(r, key), fmt) for r in shown]
        if all(c == "-" for c in cells):
            continue
        if pair:
            x, y = getattr(s, key), getattr(a, key)
            speed = None if higher is None or not x or not y else (x / y if higher else y / x)
            cells.append("-" if speed is None else f"{speed:.2f}x")
        lines.append("| " + " | ".join([label] + cells) + " |")
    if any(r.per_position_acceptance for r in shown):
        cells = [" ".join(f"{p:.2f}" for p in r.per_position_acceptance) if r.per_position_acceptance else "-"
                 for r in shown]
        lines.append("| " + " | ".join(["acceptance by position 1..γ"] + cells + (["-"] if pair else [])) + " |")
    if any(r.exact_vs_ar is not None for r in shown):
        cells = ["-" if r.exact_vs_ar is None else f"{r.exact_vs_ar}/{r.num_requests}" for r in shown]
        lines.append("| " + " | ".join(["output equal to AR"] + cells + (["-"] if pair else [])) + " |")
    for r in results.values():
        if r.note:
            lines.append(f"\n{r.name}: skipped: {r.note}")
    return "\n".join(lines)


def result_dict(r: MethodResult) -> dict:
    """asdict, minus the per-token and per-round lists (a million values at the public shape)."""
    d = asdict(r)
    for q in d["requests"]:
        for key in ("itl_s", "accepts", "start_s", "end_s"):
            q.pop(key)
    return d


def write_results(report: dict, path: str | Path, heading: str) -> tuple[Path, Path]:
    """The report as JSON at `path` and its table as Markdown beside it (same name, .md) -> both."""
    path = Path(path)
    if path.suffix == ".md":
        path = path.with_suffix(".json")
    md = path.with_suffix(".md")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    md.write_text(f"{heading}\n\n{report['table']}\n")
    return path, md
