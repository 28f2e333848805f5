"""The one thread that owns the engine. HTTP threads submit jobs to a FIFO queue and read the
job's events; the engine runs one request at a time (batch 1), so concurrent clients wait
their turn instead of sharing caches. A cancelled job (client gone, stop string seen) stops at
the next round boundary and the engine moves on."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from splitserve.serve.metrics import Metrics
from splitserve.speculative.engine import Engine, SamplingParams

log = logging.getLogger("splitserve.serve")


class QueueFullError(RuntimeError):
    pass


@dataclass
class Job:
    prompt_ids: list[int]
    params: SamplingParams
    # ("tokens", list[int]) per round, then exactly one ("done", GenStats) or ("error", str).
    events: queue.Queue = field(default_factory=queue.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    cancel_reason: str = "cancelled"  # "stop": the front end saw a stop string, the reply is complete
    arrival: float = field(default_factory=time.perf_counter)  # TTFT and queue time count from here
    # Called (from the engine thread) after each event: the async front end's wake-up, so it
    # waits on its own event loop instead of holding a thread per request.
    wake: Callable[[], None] | None = None

    def cancel(self, reason: str = "cancelled") -> None:
        self.cancel_reason = reason
        self.cancelled.set()

    def put(self, kind: str, value) -> None:
        self.events.put((kind, value))
        if self.wake is not None:
            self.wake()


class EngineWorker:
    def __init__(self, engine: Engine, metrics: Metrics, max_queue: int = 64):
        self.engine, self.metrics = engine, metrics
        self._jobs: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._loop, name="splitserve-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = 30.0) -> None:
        self._jobs.put(None)
        self._thread.join(timeout)

    def submit(self, prompt_ids: list[int], params: SamplingParams, arrival: float | None = None,
               wake: Callable[[], None] | None = None) -> Job:
        job = Job(prompt_ids, params, wake=wake)
        if arrival is not None:
            job.arrival = arrival
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            raise QueueFullError(f"{self._jobs.maxsize} requests are already waiting; retry later") from None
        self.metrics.gauge("queued", +1)
        return job

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self.metrics.gauge("queued", -1)
            if job.cancelled.is_set():  # the client left while waiting
                self.metrics.count("cancelled")
                job.put("error", "cancelled")
                continue
            self.metrics.gauge("running", +1)
            queue_s = time.perf_counter() - job.arrival
            try:
                stats = self.engine.generate(job.prompt_ids, job.params,
                                             on_tokens=lambda toks, j=job: self._emit(j, toks))
                if stats.finish_reason == "cancelled":
                    stats.finish_reason = job.cancel_reason
                self.metrics.observe(stats, queue_s)
                job.put("done", stats)
            except Exception as exc:  # keep serving: report to this client (the front end counts it)
                log.exception("generation failed")
                job.put("error", f"generation failed: {type(exc).__name__}: {exc}")
            finally:
                self.metrics.gauge("running", -1)

    @staticmethod
    def _emit(job: Job, tokens: list[int]) -> bool:
        job.put("tokens", tokens)
        return not job.cancelled.is_set()
