"""Training captures at a few fixed shapes, each replayed as a CUDA graph.

An eager transformers forward of a small target costs many times more host time (Python and
kernel launches) than GPU work (docs/results/train_step_h200.md). Here a sample is right-padded
to its length bucket (the next power of two, at least `min_bucket`), and the samples of one
bucket are captured together: `rows(L)` of them per forward, a number fixed per bucket
(`group_tokens // L`). Each bucket's (rows, L) forward replays as one CUDA graph, so a batch of
samples costs one launch per bucket it touches instead of one eager forward per sample.

A record depends only on its own tokens. The bucket is a function of the sample's own length;
under causal attention the padding after its last real token reaches none of its real positions,
and the rows of a forward never mix (attention, norms and products are per row). The forward's
shape is fixed per bucket, whoever shares it, so the same kernels run: a record equals its solo
capture up to the rounding of a product kernel that splits its reduction differently for
different row tiles. Off CUDA, or with graphs off, the same grouping runs eagerly; samples
longer than the largest bucket run alone at their own length.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

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
    def __init__(self, target: CaptureTarget, max_len: int, min_bucket: int = 64, use_graphs: bool = True,
                 group_tokens: int = 0):
        if group_tokens < 0:
            raise ValueError(f"target.capture_group_tokens must be >= 0 (0: one sample per forward), "
                             f"got {group_tokens}")
        self.target = target
        self.min_bucket = min_bucket
        self.max_bucket = max(min_bucket, 1 << (max(max_len, 1) - 1).bit_length())
        self.group_tokens = group_tokens
        self.graphs = StepGraphs(use_graphs, target.device, max_graphs=32, source=target)
        self._ids: dict[int, torch.Tensor] = {}  # bucket -> (rows, L) input buffer
        self._out: dict[int, Capture] = {}  # bucket -> the last capture of that bucket

    def bucket(self, n: int) -> int:
        return max(self.min_bucket, 1 << (n - 1).bit_length())

    def rows(self, length: int) -> int:
        """Samples per forward in the bucket of `length` tokens (fixed per bucket)."""
        return max(1, self.group_tokens // length)

    def _step(self, length: int):
        def run() -> None:
            with varlen_sdpa():
                self._out[length] = self.target.capture(self._ids[length])

        return run

    def _forward(self, length: int, group: Sequence[torch.Tensor]) -> Capture:
        """Up to rows(length) samples (each (n,) ids) -> the bucket's capture, (rows, L, ...)."""
        rows = self.rows(length)
        host = torch.zeros(rows, length, dtype=torch.long)  # padding: any id (see the module doc)
        for r, ids in enumerate(group):
            host[r, : ids.numel()] = ids
        buf = self._ids.get(length)
        if buf is None:
            buf = self._ids[length] = torch.zeros(rows, length, dtype=torch.long, device=self.target.device)
        buf.copy_(host)
        step = self._step(length)
        if self.graphs.enabled and length not in self.graphs:
            try:
                self.graphs.prepare(length, step)
            except RuntimeError as exc:  # a forward that syncs with the host cannot be captured
                warnings.warn(f"target capture runs eagerly: CUDA graph capture failed ({exc})", stacklevel=3)
                self.graphs.enabled = False
        self.graphs.run(length, step)
        return self._out[length]

    def capture_many(self, samples: Sequence[torch.Tensor]) -> list[Capture]:
        """(n_i,) token ids each -> one Capture per sample, aux (1, n_i, m*D) and final (1, n_i, D),
        in the given order and owned by the caller."""
        out: list[Capture | None] = [None] * len(samples)
        by_bucket: dict[int, list[int]] = {}
        for i, ids in enumerate(samples):
            length = self.bucket(ids.numel())
            if length > self.max_bucket:
                out[i] = capture_unpadded(self.target, ids)
            else:
                by_bucket.setdefault(length, []).append(i)
        for length, members in by_bucket.items():
            rows = self.rows(length)
            for start in range(0, len(members), rows):
                group = members[start : start + rows]
                cap = self._forward(length, [samples[i] for i in group])
                for r, i in enumerate(group):
                    n = samples[i].numel()
                    out[i] = Capture(aux=cap.aux[r : r + 1, :n].clone(), final=cap.final[r : r + 1, :n].clone())
        return out  # type: ignore[return-value]

    def __call__(self, ids: torch.Tensor) -> Capture:
        """ids: (n,) token ids -> Capture with aux (1, n, m*D) and final (1, n, D), owned by the caller."""
        return self.capture_many([ids])[0]
