"""Training captures at a few fixed lengths, each replayed as a CUDA graph.

An eager transformers forward of a small target costs many times more host time (Python and
kernel launches) than GPU work (docs/results/train_step_h200.md). Training
captures one sample at a time, so that cost is paid per sample. Here a sample is right-padded
to its length bucket (the next power of two, at least `min_bucket`) and the forward for that
bucket runs as one CUDA graph: one launch per capture.

A record still depends only on its own tokens. The bucket is a function of the sample's own
length, and under causal attention the padding after the last real token reaches none of the
real positions. Off CUDA, or with graphs off, the same bucketing runs eagerly; samples longer
than the largest bucket run eagerly at their own length.
"""

from __future__ import annotations

import warnings

import torch

from splitserve.records import Capture
from splitserve.target.backend import CaptureTarget
from splitserve.target.graphs import StepGraphs
from splitserve.target.sdpa import varlen_sdpa


def use_capture_graphs(cfg, device: torch.device) -> bool:
    """TargetConfig.capture_graphs resolved for a target on `device` (None: on for CUDA)."""
    if cfg.capture_graphs is None:
        return cfg.backend == "transformers" and device.type == "cuda"
    if cfg.capture_graphs and cfg.backend != "transformers":
        raise ValueError(f"target.capture_graphs applies to the transformers backend, not {cfg.backend!r}")
    return cfg.capture_graphs


def capture_unpadded(target: CaptureTarget, ids: torch.Tensor) -> Capture:
    """ids: (n,) -> the target's eager capture at the sample's own length (no bucket)."""
    with varlen_sdpa():  # every sample is a new length (target/sdpa.py)
        return target.capture(ids[None].to(target.device))


class BucketedCapture:
    def __init__(self, target: CaptureTarget, max_len: int, min_bucket: int = 64, use_graphs: bool = True):
        self.target = target
        self.min_bucket = min_bucket
        self.max_bucket = max(min_bucket, 1 << (max(max_len, 1) - 1).bit_length())
        self.graphs = StepGraphs(use_graphs, target.device, max_graphs=32)
        self._ids: dict[int, torch.Tensor] = {}  # bucket -> (1, L) input buffer
        self._out: dict[int, Capture] = {}  # bucket -> the last capture of that bucket

    def bucket(self, n: int) -> int:
        return max(self.min_bucket, 1 << (n - 1).bit_length())

    def _step(self, length: int):
        def run() -> None:
            with varlen_sdpa():
                self._out[length] = self.target.capture(self._ids[length])

        return run

    def __call__(self, ids: torch.Tensor) -> Capture:
        """ids: (n,) token ids -> Capture with aux (1, n, m*D) and final (1, n, D), owned by the caller."""
        n = ids.numel()
        length = self.bucket(n)
        if length > self.max_bucket:
            return capture_unpadded(self.target, ids)
        buf = self._ids.get(length)
        if buf is None:
            buf = self._ids[length] = torch.zeros(1, length, dtype=torch.long, device=self.target.device)
        buf[0, :n].copy_(ids)
        buf[0, n:].zero_()  # padding: any id; causal attention keeps it away from positions < n
        step = self._step(length)
        if self.graphs.enabled and length not in self.graphs:
            try:
                self.graphs.prepare(length, step)
            except RuntimeError as exc:  # a forward that syncs with the host cannot be captured
                warnings.warn(f"target capture runs eagerly: CUDA graph capture failed ({exc})", stacklevel=2)
                self.graphs.enabled = False
        self.graphs.run(length, step)
        out = self._out[length]
        return Capture(aux=out.aux[:, :n].clone(), final=out.final[:, :n].clone())
