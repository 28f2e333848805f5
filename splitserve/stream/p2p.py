"""torch.distributed channels: one producer to one consumer (`P2PChannel`), and the fan-in
and fan-out helpers that pair several of them. Works on gloo (CPU), and with record payloads on
NCCL (GPU) while its control traffic stays on gloo."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, fields, replace
from time import perf_counter
from types import TracebackType

import torch
import torch.distributed as dist

from splitserve.records import HiddenRecord
from splitserve.stream.channel import (
    ChannelClosed,
    ChannelMismatch,
    ChannelSpec,
    ChannelStats,
    ConsumerStopped,
    ProducerError,
    Role,
)
from splitserve.stream.wire import (
    HEADER_LEN,
    HEADER_NBYTES,
    MAGIC,
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

# Tag offsets inside one channel. Each direction has a fixed message order, so the tags are a
# second guard (gloo matches on them; NCCL ignores them and relies on the order alone).
# Header, credit: control group. Payload k (0..3), probe: payload group (an ERROR's text: control).
_TAG_HEADER, _TAG_PAYLOAD, _TAG_PROBE, _TAG_CREDIT = 0, 1, 5, 7


_TAGS_PER_CHANNEL = 8
_STOP = -1  # credit value meaning "the consumer wants no more records"
_CPU = torch.device("cpu")  # every control message lives here, whatever the payloads' device


@dataclass
class _InFlight:
    """A sent message's pending calls, and the tensors they read, kept alive until acknowledged."""

    host: list[dist.Work]  # calls on CPU tensors (always the header): done once waited for
    gpu: list[dist.Work]  # a record's payload calls on a GPU: done once settled (see _settle)
    tensors: list[torch.Tensor]


def _resolve(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """None means the default group; named, so that two groups can be told apart by identity."""
    return group if group is not None else dist.group.WORLD


class P2PChannel:
    """One producer rank and one consumer rank over torch.distributed point-to-point calls.

    `peer` is the other end's global rank. Both ends must be built with equal `spec` and `tag`;
    the constructor exchanges a HELLO and raises `ChannelMismatch` (or `WireVersionError`) on
    both ends if they differ. Several channels between the same two ranks need different `tag`s
    (and, with payloads on NCCL, which ignores tags, must not be used at the same time).

    Two planes. Control traffic (the HELLO exchange, every header, credits and stop, END, and
    ERROR with its text) is CPU tensors on `control_group`; only a record's payload tensors go
    on `group`, on `device`, and received records are returned on `device`.
      * gloo alone: `device` is the CPU and `control_group` defaults to `group` (None: the
        default group), one group for everything.
      * NCCL: `group` is an NCCL group, `device` this rank's GPU, and `control_group` (then
        required) a gloo group holding both ranks. A payload receive is posted only once its
        header has arrived over gloo, and is complete on the GPU before recv() returns; the
        producer issues a record's payload sends right after its header. So no NCCL call of the
        channel waits on anything but the other end's matching call, which that end reaches
        next, and none is left pending across the channel's end.
    With two planes the constructor also passes one int64 over `group`, each end waiting for
    it: under NCCL this opens the pair's communicator while both ends are in the constructor,
    not in the middle of the stream, and a wrong payload group fails here.

    Messages, producer -> consumer: HELLO, then per record a header and its payload (see
    `wire`), and finally END or ERROR. Consumer -> producer: HELLO, then one int64 per message
    received (1 = a credit back, -1 = stop). Every producer message, END included, takes a
    credit and gets one back, so a producer's close() returns once the consumer has
    received everything and no call is left pending on either side.

    Producer: `send`, then `close()` (END) or `fail(message)` (ERROR). A producer's in-flight
    records are held by reference until their credit returns; do not change them in place.
    A record's payload sends are waited for, until done on the GPU too, when its credit comes
    back rather than in send(): the producer computes its next record while this one moves,
    and a returned credit means the consumer already holds the data, so that wait is short.
    Every one is done by the time close() or fail() returns, so a collective after them never
    runs beside a pending payload send.
    Consumer: `recv` until None; `close()` before that asks the producer to stop and discards
    what it still sends until its END, so both ends can shut down cleanly. On a GPU, a record
    recv() returns is ready on the calling thread's current stream.

    Transport notes. gloo never reports a pending call as complete before it is waited on, so
    there a producer takes its returned credits only once it has none left: max_in_flight
    then reads `credits` as soon as that many records were sent, whatever the consumer's
    speed, while send_wait_s (near zero when the credits were already back) is the real
    measure of back-pressure. Credits travel on the control group, so with NCCL payloads they
    are never queued behind a payload on the pair's NCCL stream.
    """

    def __init__(
        self,
        peer: int,
        role: Role,
        spec: ChannelSpec,
        *,
        group: dist.ProcessGroup | None = None,
        control_group: dist.ProcessGroup | None = None,
        device: torch.device | str = "cpu",
        tag: int = 0,
    ) -> None:
        if role not in ("producer", "consumer"):
            raise ValueError(f"role must be 'producer' or 'consumer', got {role!r}")
        self.device = torch.device(device)
        if self.device.type != "cpu" and control_group is None:
            raise ValueError(
                f"a channel with payloads on {self.device} needs a control_group: a gloo group holding "
                f"this rank and rank {peer}, for its headers and credits (with every message on NCCL, "
                "the channel hung on two H200s)"
            )
        self.peer, self.role, self.spec = peer, role, spec
        self.group = _resolve(group)
        self.control_group = self.group if control_group is None else _resolve(control_group)
        # Payloads on a GPU: the channel's own stream, so waiting for its NCCL calls never
        # waits for the caller's work on the current stream (see _settle).
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._tag0 = tag * _TAGS_PER_CHANNEL
        self._stats = ChannelStats()
        self._ended = False  # producer: END/ERROR sent; consumer: END/ERROR received
        self._handshake()
        if self.control_group is not self.group or self.device.type != "cpu":
            self._probe_payload_group()
        if role == "producer":
            self._available = spec.credits
            self._pending: deque[_InFlight] = deque()  # one per message sent, oldest first
            self._stopped = False
            self._credit = torch.zeros(1, dtype=torch.int64)
            self._credit_work: dist.Work | None = None
            self._post_credit_recv()
        else:
            self._acks: deque[tuple[dist.Work, torch.Tensor]] = deque()
            self._stop_sent = False
            self._header = torch.zeros(HEADER_LEN, dtype=torch.int64)  # reused for every message

    # ---- both ends -----------------------------------------------------------------------

    def _handshake(self) -> None:
        mine = self.spec.hello().to_tensor(_CPU)
        theirs = torch.zeros_like(mine)
        # Opposite orders on the two ends, so neither waits on a send the other has not reached.
        if self.role == "consumer":
            self._isend(mine, _TAG_HEADER, self.control_group).wait()
            self._recv(theirs, _TAG_HEADER, self.control_group)
        else:
            self._recv(theirs, _TAG_HEADER, self.control_group)
            self._isend(mine, _TAG_HEADER, self.control_group).wait()
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

    def _probe_payload_group(self) -> None:
        """One int64 (MAGIC) from producer to consumer over the payload group, complete on both
        ends before the constructor returns."""
        with self._on_stream(self.device):
            t = torch.full((1,), MAGIC if self.role == "producer" else 0, dtype=torch.int64, device=self.device)
            op = self._isend if self.role == "producer" else self._irecv
            work = op(t, _TAG_PROBE, self.group)
        self._settle([work], self.device)
        if self.role == "consumer" and int(t.item()) != MAGIC:
            raise WireError(f"the payload group's first message from rank {self.peer} was not this channel's")

    def _isend(self, t: torch.Tensor, tag: int, group: dist.ProcessGroup) -> dist.Work:
        return dist.isend(t, dst=self.peer, group=group, tag=self._tag0 + tag)

    def _irecv(self, t: torch.Tensor, tag: int, group: dist.ProcessGroup) -> dist.Work:
        return dist.irecv(t, src=self.peer, group=group, tag=self._tag0 + tag)

    def _recv(self, t: torch.Tensor, tag: int, group: dist.ProcessGroup) -> None:
        dist.recv(t, src=self.peer, group=group, tag=self._tag0 + tag)

    def _route(self, kind: Kind) -> tuple[dist.ProcessGroup, torch.device]:
        """(group, device) of a message's payload: a record's data plane, else control."""
        return (self.group, self.device) if kind == Kind.RECORD else (self.control_group, _CPU)

    def _on_stream(self, device: torch.device) -> AbstractContextManager:
        """The channel's own stream for calls on a GPU; nothing to switch for the CPU."""
        return torch.cuda.stream(self._stream) if device.type == "cuda" else nullcontext()

    def _settle(self, works: list[dist.Work], device: torch.device) -> None:
        """Block until these calls are done, on the GPU too, and wait for nothing else."""
        if not works:
            return
        with self._on_stream(device):
            for w in works:
                w.wait()  # NCCL: only makes the current (the channel's) stream wait for the call
        if device.type == "cuda":
            self._stream.synchronize()  # holds nothing but those waits

    def stats(self) -> ChannelStats:
        return replace(self._stats)

    @property
    def in_flight(self) -> int:
        """Producer end: messages sent whose credit has not come back yet (0 on a consumer)."""
        return self.spec.credits - self._available if self.role == "producer" else 0

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
        self._finish(*error_payload(message, _CPU))  # control traffic, like END

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
        """The header on the control group, then at once the payload on its own plane (a
        record's on the payload group, from the current stream, which produced it)."""
        hdr = header.to_tensor(_CPU)
        host = [self._isend(hdr, _TAG_HEADER, self.control_group)]
        group, device = self._route(header.kind)
        # An empty tensor is skipped on both ends (e.g. a T=0 record).
        sends = [self._isend(p, _TAG_PAYLOAD + k, group) for k, p in enumerate(payload) if p.numel()]
        on_gpu = device.type == "cuda"
        self._pending.append(_InFlight(host if on_gpu else host + sends, sends if on_gpu else [], [hdr, *payload]))
        self._available -= 1
        self._stats.max_in_flight = max(self._stats.max_in_flight, self.in_flight)

    def _post_credit_recv(self) -> None:
        self._credit_work = self._irecv(self._credit, _TAG_CREDIT, self.control_group)

    def _complete(self, msg: _InFlight) -> None:
        """The consumer got this message, so its sends are done or finishing: wait for all of
        them (a record's payload until done on the GPU), which releases its tensors."""
        for w in msg.host:
            w.wait()
        self._settle(msg.gpu, self.device)

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
                self._complete(self._pending.popleft())
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
        self._recv(self._header, _TAG_HEADER, self.control_group)
        header = Header.from_tensor(self._header)
        self._stats.recv_wait_s += perf_counter() - t0
        result: HiddenRecord | str | None = None
        if header.kind == Kind.RECORD:
            self._check_header(header)
            result = decode(header, self._recv_payload(header))
            self._stats.records += 1
            self._stats.bytes += HEADER_NBYTES + payload_nbytes(header)
        elif header.kind == Kind.ERROR:
            result = error_message(self._recv_payload(header))
        elif header.kind != Kind.END:
            raise WireError(f"unexpected {header.kind.name} message from producer rank {self.peer}")
        self._ack(1)
        if header.kind != Kind.RECORD:
            self._ended = True
            while self._acks:  # the producer's close() receives every one of them
                self._acks.popleft()[0].wait()
        return header.kind, result

    def _recv_payload(self, header: Header) -> list[torch.Tensor]:
        """The payload its header announces, received into fresh tensors (the caller keeps
        them), each receive posted only now and done before this returns."""
        group, device = self._route(header.kind)
        with self._on_stream(device):
            bufs = [torch.empty(shape, dtype=dt, device=device) for shape, dt in payload_shapes(header)]
            works = [self._irecv(p, _TAG_PAYLOAD + k, group) for k, p in enumerate(bufs) if p.numel()]
        self._settle(works, device)
        if device.type == "cuda":
            # Allocated on the channel's stream, used on the caller's: freeing one waits for that.
            for p in bufs:
                p.record_stream(torch.cuda.current_stream(device))
        return bufs

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
        t = torch.tensor([value], dtype=torch.int64)
        self._acks.append((self._isend(t, _TAG_CREDIT, self.control_group), t))
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
        control_group: dist.ProcessGroup | None = None,
        device: torch.device | str = "cpu",
        tag: int = 0,
    ) -> FanInChannel:
        """One P2PChannel per peer, arguments as there."""
        kw = dict(group=group, control_group=control_group, device=device, tag=tag)
        return cls(_connect(producers, "consumer", spec, **kw))

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
        control_group: dist.ProcessGroup | None = None,
        device: torch.device | str = "cpu",
        tag: int = 0,
    ) -> FanOutChannel:
        """One P2PChannel per peer, arguments as there."""
        kw = dict(group=group, control_group=control_group, device=device, tag=tag)
        return cls(_connect(consumers, "producer", spec, **kw))

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
