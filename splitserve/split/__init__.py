"""Split training's transport: target ranks stream `HiddenRecord`s to draft-training ranks."""

from splitserve.split.channel import (
    Channel,
    ChannelClosed,
    ChannelMismatch,
    ChannelSpec,
    ChannelStats,
    ConsumerStopped,
    DumpChannel,
    FanInChannel,
    FanOutChannel,
    LocalChannel,
    P2PChannel,
    ProducerError,
)
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
