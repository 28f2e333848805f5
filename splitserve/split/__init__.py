"""Split training's transport: target ranks stream `HiddenRecord`s to draft-training ranks."""

from splitserve.split.channel import (
    Channel,
    ChannelClosed,
    ChannelMismatch,
    ChannelSpec,
    ChannelStats,
    ConsumerStopped,
    ProducerError,
)
from splitserve.split.local import DumpChannel, LocalChannel
from splitserve.split.p2p import FanInChannel, FanOutChannel, P2PChannel
from splitserve.split.wire import Header, Kind, WireError, WireVersionError, decode, encode

__all__ = [
    "Channel",
    "ChannelClosed",
    "ChannelMismatch",
    "ChannelSpec",
    "ChannelStats",
    "ConsumerStopped",
    "DumpChannel",
    "FanInChannel",
    "FanOutChannel",
    "Header",
    "Kind",
    "LocalChannel",
    "P2PChannel",
    "ProducerError",
    "WireError",
    "WireVersionError",
    "decode",
    "encode",
]
