"""Channels carry `HiddenRecord`s from producers (ranks running the target) to consumers (ranks
training the draft), with a hard bound on how many records can be in flight.

Every channel has one interface, so the training loop that consumes records does not care
whether they come over torch.distributed (`P2PChannel`, `FanInChannel`), from a thread in the
same process (`LocalChannel`) or from an offline dump (`DumpChannel`).

Flow control is by credits: a consumer grants `credits` slots up front and hands one back each
time `recv()` passes a record on. A producer with no credit left waits, so a slow consumer
shows up as the producer's `send_wait_s` instead of as unbounded memory, and a slow producer
shows up as the consumer's `recv_wait_s`.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from time import perf_counter
from types import TracebackType
from typing import Literal, Protocol

import torch
import torch.distributed as dist

from splitserve.records import HiddenRecord
from splitserve.split.wire import (
    HEADER_LEN,
    HEADER_NBYTES,
    Header,
    Kind,
    WireError,
    decode,
    encode,
    error_message,
    error_payload,
    payload_nbytes,
    payload_shapes,
)

Role = Literal["producer", "consumer"]


class ChannelClosed(RuntimeError):
    """send() on a channel whose producer end was already closed."""


class ConsumerStopped(ChannelClosed):
    """The consumer asked for no more records; the producer should close() its end now."""


class ProducerError(RuntimeError):
    """A producer reported that it failed; the message is its own description."""


class ChannelMismatch(ValueError):
    """The two ends of a channel were configured differently."""


@dataclass
class ChannelStats:
    """What one end of a channel measured.

    records, bytes: records moved by this end and their wire size (headers included).
    send_wait_s:    time a producer spent blocked because every credit was in use.
    recv_wait_s:    time a consumer spent blocked waiting for the next message.
    max_in_flight:  most records sent but not yet handed on by the consumer at once, as the
                    sending side counts them (0 on an end that only receives).
    """

    records: int = 0
    bytes: int = 0
    send_wait_s: float = 0.0
    recv_wait_s: float = 0.0
    max_in_flight: int = 0

    def as_dict(self) -> dict[str, int | float]:
        return asdict(self)

    @classmethod
    def combine(cls, parts: Sequence[ChannelStats]) -> ChannelStats:
        """Sum over several channels; max_in_flight is the largest of any one channel's."""
        out = cls()
        for p in parts:
            for f in fields(cls):
                a, b = getattr(out, f.name), getattr(p, f.name)
                setattr(out, f.name, max(a, b) if f.name == "max_in_flight" else a + b)
        return out


class Channel(Protocol):
    def send(self, record: HiddenRecord) -> None:
        """Hand a record to the consumer; blocks while no credit is free."""

    def recv(self) -> HiddenRecord | None:
        """The next record, or None once every producer has finished."""

    def close(self) -> None:
        """This end is done (see each class for what that means on its side)."""

    def stats(self) -> ChannelStats:
        """A snapshot of this end's counters."""


@dataclass(frozen=True)
class ChannelSpec:
    """What both ends of a point-to-point channel must agree on; checked when they connect.

    max_tokens: longest record (T) that fits the consumer's preallocated receive buffer
    aux_dim:    m*D, width of a record's aux
    hidden:     D, width of a record's final
    dtype:      aux/final on the wire (float32 or bfloat16); records are cast to it
    credits:    records a producer may have in flight before it must wait
    """

    max_tokens: int
    aux_dim: int
    hidden: int
    dtype: torch.dtype = torch.float32
    credits: int = 4

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.aux_dim < 1 or self.hidden < 1 or self.credits < 1:
            raise ValueError(f"channel sizes must be positive, got {self}")
        if self.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"wire dtype must be float32 or bfloat16, got {self.dtype}")

    def hello(self) -> Header:
        return Header(
            kind=Kind.HELLO,
            num_tokens=self.max_tokens,
            aux_dim=self.aux_dim,
            hidden=self.hidden,
            dtype=self.dtype,
            credits=self.credits,
        )

    @classmethod
    def from_hello(cls, header: Header) -> ChannelSpec:
        if header.kind != Kind.HELLO or header.dtype is None:
            raise WireError(f"expected a HELLO from the peer, got {header.kind.name}")
        return cls(header.num_tokens, header.aux_dim, header.hidden, header.dtype, header.credits)

    def check_record(self, record: HiddenRecord) -> None:
        """Raise ValueError, before anything is sent, for a record the consumer cannot take."""
        t = record.num_tokens
        if t > self.max_tokens:
            raise ValueError(
                f"record {record.sample_id} has {t} tokens, more than the channel's "
                f"max_tokens={self.max_tokens}: raise max_tokens on both ends or cap sample length"
            )
        aux_w = record.aux.shape[1] if record.aux.ndim == 2 else None
        final_w = record.final.shape[1] if record.final.ndim == 2 else None
        if aux_w != self.aux_dim or final_w != self.hidden:
            raise ValueError(
                f"record {record.sample_id} has aux {tuple(record.aux.shape)} and final "
                f"{tuple(record.final.shape)}, the channel carries (T, {self.aux_dim}) and "
                f"(T, {self.hidden})"
            )


# Tag offsets inside one channel. Each direction has a fixed message order, so the tags are a
# second guard (gloo matches on them; NCCL ignores them and relies on the order alone).
_TAG_HEADER, _TAG_PAYLOAD, _TAG_CREDIT = 0, 1, 7
_TAGS_PER_CHANNEL = 8
_STOP = -1  # credit value meaning "the consumer wants no more records"


@dataclass
class _InFlight:
    """A sent message's pending calls, and the tensors they read, kept alive until acknowledged."""

    works: list[dist.Work]
    tensors: list[torch.Tensor]


class P2PChannel:
    """One producer rank and one consumer rank over torch.distributed point-to-point calls.

    Works with gloo (CPU tensors) and NCCL (CUDA tensors): every tensor it sends or receives
    lives on `device`, and received records are returned on it. `peer` is the other end's
    global rank; `group` is the process group (None: the default one). Both ends must be
    built with equal `spec` and `tag`; the constructor exchanges a HELLO and raises
    `ChannelMismatch` (or `WireVersionError`) on both ends if they differ. Several channels
    between the same two ranks need different `tag`s.

    Messages, producer -> consumer: HELLO, then per record a header and its payload (see
    `wire`), and finally END or ERROR. Consumer -> producer: HELLO, then one int64 per message
    received (1 = a credit back, -1 = stop). Every producer message, END included, takes a
    credit and gets one back, so a producer's close() returns once the consumer has
    received everything and no call is left pending on either side.

    Producer: `send`, then `close()` (END) or `fail(message)` (ERROR). A producer's in-flight
    records are held by reference until their credit returns; do not change them in place.
    Consumer: `recv` until None; `close()` before that asks the producer to stop and discards
    what it still sends until its END, so both ends can shut down cleanly.

    Transport notes. gloo never reports a pending call as complete before it is waited on, so
    there a producer takes its returned credits only once it has none left: max_in_flight
    then reads `credits` as soon as that many records were sent, whatever the consumer's
    speed, while send_wait_s (near zero when the credits were already back) is the real
    measure of back-pressure. The tiny credit messages must be able to complete while the
    producer is still sending: gloo runs each call on its own; NCCL queues a pair's calls on
    one stream and relies on small sends finishing into the peer's buffer. Not yet run on NCCL.
    """

    def __init__(
        self,
        peer: int,
        role: Role,
        spec: ChannelSpec,
        *,
        group: dist.ProcessGroup | None = None,
        device: torch.device | str = "cpu",
        tag: int = 0,
    ) -> None:
        if role not in ("producer", "consumer"):
            raise ValueError(f"role must be 'producer' or 'consumer', got {role!r}")
        self.peer, self.role, self.spec, self.group = peer, role, spec, group
        self.device = torch.device(device)
        self._tag0 = tag * _TAGS_PER_CHANNEL
        self._stats = ChannelStats()
        self._ended = False  # producer: END/ERROR sent; consumer: END/ERROR received
        self._handshake()
        if role == "producer":
            self._available = spec.credits
            self._pending: deque[_InFlight] = deque()  # one per message sent, oldest first
            self._stopped = False
            self._credit = torch.zeros(1, dtype=torch.int64, device=self.device)
            self._credit_work: dist.Work | None = None
            self._post_credit_recv()
        else:
            self._acks: deque[tuple[dist.Work, torch.Tensor]] = deque()
            self._stop_sent = False
            # One receive buffer for the channel's lifetime; records are copied out of it.
            n = spec.max_tokens
            self._header = torch.zeros(HEADER_LEN, dtype=torch.int64, device=self.device)
            self._ids = torch.empty(n, dtype=torch.int64, device=self.device)  # (max_tokens,)
            self._mask = torch.empty(n, dtype=torch.uint8, device=self.device)  # (max_tokens,)
            dt = spec.dtype
            self._aux = torch.empty(n, spec.aux_dim, dtype=dt, device=self.device)  # (max_tokens, m*D)
            self._final = torch.empty(n, spec.hidden, dtype=dt, device=self.device)  # (max_tokens, D)

    # ---- both ends -----------------------------------------------------------------------

    def _handshake(self) -> None:
        mine = self.spec.hello().to_tensor(self.device)
        theirs = torch.zeros_like(mine)
        # Opposite orders on the two ends, so neither waits on a send the other has not reached.
        if self.role == "consumer":
            self._isend(mine, _TAG_HEADER).wait()
            self._recv(theirs, _TAG_HEADER)
        else:
            self._recv(theirs, _TAG_HEADER)
            self._isend(mine, _TAG_HEADER).wait()
        # Decoded only after both sent, so a version mismatch raises on both ends, not one.
        other = ChannelSpec.from_hello(Header.from_tensor(theirs))
        if other != self.spec:
            diffs = [
                f"{f.name}: this {self.role} (rank {dist.get_rank()}) has {getattr(self.spec, f.name)}, "
                f"peer rank {self.peer} has {getattr(other, f.name)}"
                for f in fields(ChannelSpec)
                if getattr(self.spec, f.name) != getattr(other, f.name)
            ]
            raise ChannelMismatch("channel ends disagree: " + "; ".join(diffs))

    def _isend(self, t: torch.Tensor, tag: int) -> dist.Work:
        return dist.isend(t, dst=self.peer, group=self.group, tag=self._tag0 + tag)

    def _recv(self, t: torch.Tensor, tag: int) -> None:
        dist.recv(t, src=self.peer, group=self.group, tag=self._tag0 + tag)

    def stats(self) -> ChannelStats:
        return replace(self._stats)

    def close(self) -> None:
        if self.role == "producer":
            self._finish(Header(kind=Kind.END), [])
        else:
            self.request_stop()
            self.drain()

    def __enter__(self) -> P2PChannel:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.role == "producer" and exc is not None and not isinstance(exc, ConsumerStopped):
            self.fail(f"{type(exc).__name__}: {exc}")
        else:
            self.close()

    def _require(self, role: Role, what: str) -> None:
        if self.role != role:
            raise RuntimeError(f"{what} is for the {role} end; this is the {self.role} end")

    # ---- producer end --------------------------------------------------------------------

    def send(self, record: HiddenRecord) -> None:
        self._require("producer", "send()")
        if self._ended:
            raise ChannelClosed(f"send() after close() on the channel to rank {self.peer}")
        self.spec.check_record(record)
        header, payload = encode(record, self.spec.dtype, self.device)
        while self._take_credit(block=False):
            pass
        if self._available == 0 and not self._stopped:
            t0 = perf_counter()
            while self._available == 0 and not self._stopped:
                self._take_credit(block=True)
            self._stats.send_wait_s += perf_counter() - t0
        if self._stopped:
            raise ConsumerStopped(f"consumer rank {self.peer} asked for no more records")
        self._post(header, payload)
        self._stats.records += 1
        self._stats.bytes += HEADER_NBYTES + payload_nbytes(header)

    def fail(self, message: str) -> None:
        """End the stream with an error the consumer's recv() raises as ProducerError."""
        self._require("producer", "fail()")
        self._finish(*error_payload(message, self.device))

    def _finish(self, header: Header, payload: list[torch.Tensor]) -> None:
        if self._ended:
            return
        # END/ERROR take a credit like a record: its credit coming back is the consumer's
        # receipt, and waiting for all of them leaves no call pending on either side.
        while self._available == 0:
            self._take_credit(block=True)
        self._ended = True
        self._post(header, payload)
        while self._available < self.spec.credits:
            self._take_credit(block=True)

    def _post(self, header: Header, payload: list[torch.Tensor]) -> None:
        hdr = header.to_tensor(self.device)
        works = [self._isend(hdr, _TAG_HEADER)]
        for k, p in enumerate(payload):
            if p.numel():  # an empty tensor is skipped on both ends (e.g. a T=0 record)
                works.append(self._isend(p, _TAG_PAYLOAD + k))
        self._pending.append(_InFlight(works, [hdr, *payload]))
        self._available -= 1
        self._stats.max_in_flight = max(self._stats.max_in_flight, self.spec.credits - self._available)

    def _post_credit_recv(self) -> None:
        self._credit_work = dist.irecv(
            self._credit, src=self.peer, group=self.group, tag=self._tag0 + _TAG_CREDIT
        )

    def _take_credit(self, block: bool) -> bool:
        """Handle one message from the consumer if one is there (or wait for it if `block`)."""
        work = self._credit_work
        if work is None:
            if block:
                raise RuntimeError("waiting for a credit that can never come (channel protocol bug)")
            return False
        if not block and not work.is_completed():
            return False
        work.wait()
        value = int(self._credit.item())
        self._credit_work = None
        if value == _STOP:
            self._stopped = True
        else:
            for _ in range(value):
                # The consumer got this message, so its sends are done: release its tensors.
                for w in self._pending.popleft().works:
                    w.wait()
            self._available += value
        # Once ended and every credit is back, the consumer will send nothing more.
        if not (self._ended and self._available == self.spec.credits):
            self._post_credit_recv()
        return True

    # ---- consumer end --------------------------------------------------------------------

    def recv(self) -> HiddenRecord | None:
        self._require("consumer", "recv()")
        if self._ended or self._stop_sent:
            return None
        kind, result = self._recv_message()
        if kind == Kind.RECORD:
            return result
        if kind == Kind.ERROR:
            raise ProducerError(f"producer rank {self.peer} failed: {result}")
        return None

    def request_stop(self) -> None:
        """Ask the producer to stop; it learns this on its next wait for a credit. Call drain()
        afterwards (close() does both) to take what it sent meanwhile up to its END."""
        self._require("consumer", "request_stop()")
        if not self._ended and not self._stop_sent:
            self._stop_sent = True
            self._ack(_STOP)

    def drain(self) -> None:
        """Receive and discard messages until the producer's END (or ERROR)."""
        self._require("consumer", "drain()")
        while not self._ended:
            self._recv_message()

    def _recv_message(self) -> tuple[Kind, HiddenRecord | str | None]:
        t0 = perf_counter()
        self._recv(self._header, _TAG_HEADER)
        header = Header.from_tensor(self._header)  # reading it waits for it, also on a GPU
        self._stats.recv_wait_s += perf_counter() - t0
        result: HiddenRecord | str | None = None
        if header.kind == Kind.RECORD:
            self._check_header(header)
            t = header.num_tokens
            views = [self._ids[:t], self._mask[:t], self._aux[:t], self._final[:t]]
            self._recv_payload(views)
            result = decode(header, views, copy=True)  # copied out: the buffer is reused
            self._stats.records += 1
            self._stats.bytes += HEADER_NBYTES + payload_nbytes(header)
        elif header.kind == Kind.ERROR:
            buf = [torch.empty(s, dtype=d, device=self.device) for s, d in payload_shapes(header)]
            self._recv_payload(buf)
            result = error_message(buf)
        elif header.kind != Kind.END:
            raise WireError(f"unexpected {header.kind.name} message from producer rank {self.peer}")
        self._ack(1)
        if header.kind != Kind.RECORD:
            self._ended = True
            while self._acks:  # the producer's close() receives every one of them
                self._acks.popleft()[0].wait()
        return header.kind, result

    def _recv_payload(self, tensors: list[torch.Tensor]) -> None:
        for k, p in enumerate(tensors):
            if p.numel():
                self._recv(p, _TAG_PAYLOAD + k)

    def _check_header(self, header: Header) -> None:
        s = self.spec
        if (
            header.num_tokens > s.max_tokens
            or header.aux_dim != s.aux_dim
            or header.hidden != s.hidden
            or header.dtype != s.dtype
        ):
            raise WireError(f"producer rank {self.peer} sent {header}, outside this channel's {s}")

    def _ack(self, value: int) -> None:
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        self._acks.append((self._isend(t, _TAG_CREDIT), t))
        # At most credits (+1 stop) acks can be unread by the producer, so an older one is
        # already done: waiting on it frees it without blocking and bounds this queue.
        while self._acks and (len(self._acks) > self.spec.credits + 1 or self._acks[0][0].is_completed()):
            self._acks.popleft()[0].wait()


def _connect(peers: Sequence[int], role: Role, spec: ChannelSpec, **kw) -> list[P2PChannel]:
    # Handshakes run in increasing rank order on every rank, so a consumer and a producer that
    # each connect to several peers can never wait on each other in a cycle.
    made = {p: P2PChannel(p, role, spec, **kw) for p in sorted(peers)}
    return [made[p] for p in peers]


class FanInChannel:
    """A consumer fed by several producers, one `P2PChannel` each.

    recv() takes one record from each producer that has not ended, in turn (round-robin in
    the order given), and returns None once all have ended. The order is deterministic, at
    the price that one slow producer holds up the rest until its record arrives.
    """

    def __init__(self, channels: Sequence[P2PChannel]) -> None:
        if not channels or any(c.role != "consumer" for c in channels):
            raise ValueError("FanInChannel needs one or more consumer-end P2PChannels")
        self.channels = list(channels)
        self._active = list(channels)
        self._next = 0

    @classmethod
    def connect(
        cls,
        producers: Sequence[int],
        spec: ChannelSpec,
        *,
        group: dist.ProcessGroup | None = None,
        device: torch.device | str = "cpu",
        tag: int = 0,
    ) -> FanInChannel:
        return cls(_connect(producers, "consumer", spec, group=group, device=device, tag=tag))

    def send(self, record: HiddenRecord) -> None:
        raise RuntimeError("FanInChannel only receives")

    def recv(self) -> HiddenRecord | None:
        while self._active:
            i = self._next % len(self._active)
            ch = self._active[i]
            try:
                record = ch.recv()
            except ProducerError:
                del self._active[i]  # that producer is done; the others can still be read
                self._next = i
                raise
            if record is None:
                del self._active[i]
                self._next = i  # the next producer moved into slot i
                continue
            self._next = i + 1
            return record
        return None

    def close(self) -> None:
        """Stop every producer still sending (all asked first, so they stop in parallel)."""
        for ch in self.channels:
            ch.request_stop()
        for ch in self.channels:
            ch.drain()
        self._active = []

    def stats(self) -> ChannelStats:
        return ChannelStats.combine([ch.stats() for ch in self.channels])

    def peer_stats(self) -> dict[int, ChannelStats]:
        return {ch.peer: ch.stats() for ch in self.channels}

    def __enter__(self) -> FanInChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FanOutChannel:
    """A producer feeding several consumers, one `P2PChannel` each.

    Routing is by position: the k-th record this producer sends goes to consumer k % n, in
    the order given. With one producer, consumer c thus gets records c, c+n, c+2n, ...;
    which samples a producer sends (and so which consumer trains on what) is the caller's.
    """

    def __init__(self, channels: Sequence[P2PChannel]) -> None:
        if not channels or any(c.role != "producer" for c in channels):
            raise ValueError("FanOutChannel needs one or more producer-end P2PChannels")
        self.channels = list(channels)
        self._sent = 0

    @classmethod
    def connect(
        cls,
        consumers: Sequence[int],
        spec: ChannelSpec,
        *,
        group: dist.ProcessGroup | None = None,
        device: torch.device | str = "cpu",
        tag: int = 0,
    ) -> FanOutChannel:
        return cls(_connect(consumers, "producer", spec, group=group, device=device, tag=tag))

    def send(self, record: HiddenRecord) -> None:
        self.channels[self._sent % len(self.channels)].send(record)
        self._sent += 1

    def recv(self) -> HiddenRecord | None:
        raise RuntimeError("FanOutChannel only sends")

    def close(self) -> None:
        for ch in self.channels:
            ch.close()

    def fail(self, message: str) -> None:
        for ch in self.channels:
            ch.fail(message)

    def stats(self) -> ChannelStats:
        return ChannelStats.combine([ch.stats() for ch in self.channels])

    def __enter__(self) -> FanOutChannel:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is not None and not isinstance(exc, ConsumerStopped):
            self.fail(f"{type(exc).__name__}: {exc}")
        else:
            self.close()


def record_nbytes(record: HiddenRecord) -> int:
    tensors = (record.input_ids, record.loss_mask, record.aux, record.final)
    return sum(t.numel() * t.element_size() for t in tensors)


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


class _Indexable(Protocol):
    def __getitem__(self, i: int) -> HiddenRecord: ...


class DumpChannel:
    """Records of an offline dump (`DumpReader`) in the given order, as a consumer end.

    Lets online and offline training share one consumer loop. recv_wait_s is the time spent
    reading from disk.
    """

    def __init__(self, reader: _Indexable, indices: Sequence[int]) -> None:
        self.reader = reader
        self._indices = list(indices)
        self._pos = 0
        self._stats = ChannelStats()

    def send(self, record: HiddenRecord) -> None:
        raise RuntimeError("DumpChannel only receives")

    def recv(self) -> HiddenRecord | None:
        if self._pos >= len(self._indices):
            return None
        t0 = perf_counter()
        record = self.reader[self._indices[self._pos]]
        self._stats.recv_wait_s += perf_counter() - t0
        self._pos += 1
        self._stats.records += 1
        self._stats.bytes += record_nbytes(record)
        return record

    def close(self) -> None:
        self._pos = len(self._indices)

    def stats(self) -> ChannelStats:
        return replace(self._stats)
