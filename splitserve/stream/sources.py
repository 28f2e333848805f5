"""Where training records come from: the target run in-process, or an offline dump.

Both yield the same `HiddenRecord`s, so one trainer consumes either; the split trainer's
network channel is a third source behind the same `get` call.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Protocol

import torch

from splitserve.records import HiddenRecord
from splitserve.target.backend import CaptureTarget
from splitserve.target.bucketed import BucketedCapture, capture_unpadded


class RecordSource(Protocol):
    num_samples: int

    def get(self, indices: list[int]) -> list[HiddenRecord]:
        """The records of the given sample indices, in that order."""


class TargetSource:
    """Runs the frozen target over tokenized samples on demand.

    Unpadded by default: one eager forward per sample, so a record depends only on its own
    tokens, never on which samples shared its batch, and online training and dump-then-train
    see bit-identical records. `bucketed` pads each sample to its own power-of-two bucket and
    replays that bucket's forward as a CUDA graph, `group_tokens` tokens' worth of samples per
    forward (target/bucketed.py): a record then still depends only on its own tokens, up to the
    rounding of the products.
    """

    def __init__(self, target: CaptureTarget, samples, store_dtype: torch.dtype = torch.float32,
                 bucketed: bool = False, group_tokens: int = 0):
        self.target, self.samples, self.store_dtype = target, samples, store_dtype
        self.num_samples = len(samples)
        self.bucketed = None
        if bucketed:  # fixed-shape graphs per power-of-two bucket (target/bucketed.py)
            self.bucketed = BucketedCapture(target, max((len(s.input_ids) for s in samples), default=1),
                                            group_tokens=group_tokens)

    def _capture(self, ids: list[torch.Tensor]):
        if self.bucketed is not None:
            return self.bucketed.capture_many(ids)
        return [capture_unpadded(self.target, x) for x in ids]

    def get(self, indices: list[int]) -> list[HiddenRecord]:
        ids = [torch.tensor(self.samples[i].input_ids, dtype=torch.long) for i in indices]
        records = []
        for i, x, cap in zip(indices, ids, self._capture(ids)):
            records.append(
                HiddenRecord(
                    sample_id=i,
                    input_ids=x,
                    loss_mask=torch.tensor(self.samples[i].loss_mask, dtype=torch.bool),
                    aux=cap.aux[0].to(self.store_dtype),
                    final=cap.final[0].to(self.store_dtype),
                )
            )
        return records


class DumpSource:
    """Reads records back from `splitserve dump` output (sample index = dump order)."""

    def __init__(self, reader):
        self.reader = reader
        self.num_samples = len(reader)

    def get(self, indices: list[int]) -> list[HiddenRecord]:
        return [self.reader[i] for i in indices]


class DataOrder:
    """Deterministic, resumable sample order: a fresh seeded permutation per epoch.

    The batch of step s depends only on (seed, s), so resuming needs nothing but the step.
    """

    def __init__(self, num_samples: int, batch_size: int, seed: int):
        if num_samples == 0:
            raise ValueError("no training samples")
        self.n, self.bs, self.seed = num_samples, batch_size, seed
        self._perm_epoch, self._perm = -1, None

    def _perm_of(self, epoch: int) -> torch.Tensor:
        if epoch != self._perm_epoch:
            g = torch.Generator().manual_seed(self.seed * 7919 + epoch)
            self._perm, self._perm_epoch = torch.randperm(self.n, generator=g), epoch
        return self._perm

    def batch(self, step: int) -> list[int]:
        out = []
        for cursor in range(step * self.bs, (step + 1) * self.bs):
            out.append(int(self._perm_of(cursor // self.n)[cursor % self.n]))
        return out


class ChannelSource:
    """Records arriving from target ranks over a channel, in the order the routing promises.

    A receiver thread pulls up to `prefetch` records ahead, so moving the next step's hidden
    states (the transport's payload, copies) overlaps the current step's compute; torch's
    transports release the GIL while they wait. `wait_s` is the time the trainer itself spent
    blocked for data: the honest "trainer wait".

    Each record is checked against the sample index the trainer expects, so a routing bug can
    never silently train on the wrong data. Call `close()` before closing the channel.
    """

    def __init__(self, channel, num_samples: int, prefetch: int = 2):
        self.channel, self.num_samples = channel, num_samples
        self.records = self.tokens = 0
        self.wait_s = 0.0
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, name="splitserve-receiver", daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                item = self.channel.recv()
            except BaseException as exc:  # noqa: BLE001 - handed to the trainer, raised there
                item = exc
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if item is None or isinstance(item, BaseException):
                return

    def get(self, indices: list[int]) -> list[HiddenRecord]:
        out = []
        for i in indices:
            t0 = time.perf_counter()
            record = self._queue.get()
            self.wait_s += time.perf_counter() - t0
            if isinstance(record, BaseException):
                raise record
            if record is None:
                raise RuntimeError(f"the target ranks ended their stream before sample {i}")
            if record.sample_id != i:
                raise RuntimeError(f"expected sample {i} from the target ranks, got {record.sample_id}")
            self.records += 1
            self.tokens += record.num_tokens
            out.append(record)
        return out

    def close(self) -> None:
        """Stop the receiver (it finishes the receive in progress; the producers keep sending
        until told to stop, so that receive always completes)."""
        self._stop.set()
        self._thread.join()
