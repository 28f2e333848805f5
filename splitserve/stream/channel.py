"""Channels carry `HiddenRecord`s from producers (ranks running the target) to consumers (ranks
training the draft), with a hard bound on how many records can be in flight.

Every channel has one interface (torch.distributed: `P2PChannel`, `FanInChannel`; threads of one
process: `LocalChannel`), and the trainer reads a channel through `ChannelSource`
(stream/sources.py), the same `RecordSource.get` it calls on the in-process target or a dump.

Flow control is by credits: a consumer grants `credits` slots up front and hands one back each
time `recv()` passes a record on. A producer with no credit left waits, so a slow consumer
shows up as the producer's `send_wait_s` instead of as unbounded memory, and a slow producer
shows up as the consumer's `recv_wait_s`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Literal, Protocol

import torch

from splitserve.records import HiddenRecord
from splitserve.stream.wire import Header, Kind, WireError

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


def record_nbytes(record: HiddenRecord) -> int:
    tensors = (record.input_ids, record.loss_mask, record.aux, record.final)
    return sum(t.numel() * t.element_size() for t in tensors)
