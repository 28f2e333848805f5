"""CUDA graphs for the engine's fixed-shape steps (one speculative round, one AR step).

A step is a zero-argument function that reads and writes only persistent device buffers (the
static caches, the committed length, the anchor, the output buffer), so replaying its captured
graph is the same as calling it. Keys separate steps whose Python control flow differs (mode,
greedy vs sampling, temperature); graphs share one memory pool since they never run at once.
Past `max_graphs` keys (many distinct temperatures), new keys simply run eagerly.

A graph holds the addresses of every tensor its step read, weights included. `source` is the
object whose `weights_version` says when those weights moved to new storage (an HF target whose
modules the native decoder re-pointed at packed weights): graphs captured before that would read
freed memory, so they are dropped and captured again on next use.

Off CUDA, or with use_cuda_graphs off, `run` just calls the step: the CPU path and the GPU path
execute the same code. A step that cannot be captured (a target whose forward copies a host tensor
or synchronises, as transformers' MoE routing does) turns graphs off for the rest of the run, with
one line saying why: every step then runs eagerly, the same code, the same tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

Step = Callable[[], None]


class StepGraphs:
    def __init__(self, enabled: bool, device: torch.device, generator: torch.Generator | None = None,
                 warmup_iters: int = 2, max_graphs: int = 8, source: object = None):
        self.enabled = bool(enabled) and device.type == "cuda"
        self.max_graphs = max_graphs
        self.generator = generator
        self.warmup_iters = warmup_iters
        self.source = source
        self._version = self._source_version()
        self._graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}
        self._pool = None
        self.failed: str | None = None  # why capture was given up, if it was

    def _source_version(self) -> int:
        return getattr(self.source, "weights_version", 0)

    def _drop_stale(self) -> None:
        """Forget every graph captured over weights that have since moved (see the module doc)."""
        if self._graphs and self._source_version() != self._version:
            self._graphs.clear()
            self._pool = None
        self._version = self._source_version()

    def __contains__(self, key: Hashable) -> bool:
        self._drop_stale()
        return key in self._graphs

    def prepare(self, key: Hashable, step: Step) -> None:
        """Capture `step` under `key` if it is not captured yet. Warm-up runs execute the step
        for real, so call this only where the engine state may be clobbered (before a prefill)."""
        self._drop_stale()
        if not self.enabled or key in self._graphs or len(self._graphs) >= self.max_graphs:
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # first calls allocate, autotune and load kernels
            for _ in range(self.warmup_iters):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if self.generator is not None and hasattr(graph, "register_generator_state"):
            # A user generator must be registered so each replay advances its Philox offset.
            graph.register_generator_state(self.generator)
        try:
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                step()
        except RuntimeError as exc:  # the step does something a graph cannot hold
            self.enabled, self.failed = False, str(exc).splitlines()[0]
            torch.cuda.synchronize()
            print(f"[graphs] CUDA graphs off: a step could not be captured ({self.failed}); running eagerly")
            return
        self._pool = graph.pool()
        self._graphs[key] = graph

    def run(self, key: Hashable, step: Step) -> None:
        self._drop_stale()
        graph = self._graphs.get(key)
        if graph is None:
            step()
        else:
            graph.replay()
