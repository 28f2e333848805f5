"""`LocalChannel`: a channel between threads of one process (a bounded queue), with the same
interface and failure semantics as the network channels (stream/p2p.py)."""

from __future__ import annotations

import queue
import threading
from dataclasses import replace
from time import perf_counter

from splitserve.records import HiddenRecord
from splitserve.stream.channel import (
    ChannelStats,
    ConsumerStopped,
    ProducerError,
    record_nbytes,
)
from splitserve.stream.wire import Kind


class _Marker:
    """What LocalChannel queues besides records: a producer's END or ERROR."""

    def __init__(self, kind: Kind, message: str = "") -> None:
        self.kind, self.message = kind, message


class LocalChannel:
    """Producers and a consumer in one process, through a bounded queue of `credits` slots.

    Same credit bound as P2PChannel (a put blocks while `credits` messages wait), without
    serialisation: records are passed by reference. `producers` is how many ENDs recv()
    waits for before returning None; each producer calls close() (or fail()) once.
    The consumer end's early stop is `stop()`, since both ends share this object.
    stats(): records/bytes/recv_wait_s as received, send_wait_s summed over producers.
    """

    def __init__(self, credits: int = 4, producers: int = 1) -> None:
        if credits < 1 or producers < 1:
            raise ValueError("credits and producers must be positive")
        self.credits, self.producers = credits, producers
        self._q: queue.Queue[HiddenRecord | _Marker] = queue.Queue(maxsize=credits)
        self._ended = 0
        self._stopped = False
        self._stats = ChannelStats()
        self._lock = threading.Lock()

    def _put(self, item: HiddenRecord | _Marker) -> None:
        try:
            self._q.put_nowait(item)
        except queue.Full:
            t0 = perf_counter()
            self._q.put(item)
            with self._lock:
                self._stats.send_wait_s += perf_counter() - t0
        with self._lock:
            self._stats.max_in_flight = max(self._stats.max_in_flight, self._q.qsize())

    def send(self, record: HiddenRecord) -> None:
        if self._stopped:
            raise ConsumerStopped("the consumer asked for no more records")
        self._put(record)

    def close(self) -> None:
        """One producer is done."""
        if not self._stopped:
            self._put(_Marker(Kind.END))

    def fail(self, message: str) -> None:
        if not self._stopped:
            self._put(_Marker(Kind.ERROR, message))

    def stop(self) -> None:
        """Consumer end: refuse further sends and free any producer blocked on a full queue."""
        self._stopped = True
        while True:
            try:
                self._q.get_nowait()
            except queue.Empty:
                return

    def recv(self) -> HiddenRecord | None:
        while not self._stopped and self._ended < self.producers:
            t0 = perf_counter()
            item = self._q.get()
            self._stats.recv_wait_s += perf_counter() - t0
            if isinstance(item, HiddenRecord):
                self._stats.records += 1
                self._stats.bytes += record_nbytes(item)
                return item
            self._ended += 1
            if item.kind == Kind.ERROR:
                raise ProducerError(f"producer failed: {item.message}")
        return None

    def stats(self) -> ChannelStats:
        with self._lock:
            return replace(self._stats)
