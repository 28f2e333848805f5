"""Where `HiddenRecord`s come from and how they travel: record sources (an in-process target, a
dump on disk, a channel from target ranks), the dump format, and the channels' wire format."""

from splitserve.stream.channel import (
    Channel,
    ChannelClosed,
    ChannelMismatch,
    ChannelSpec,
    ChannelStats,
    ConsumerStopped,
    ProducerError,
)
from splitserve.stream.dump_reader import FORMAT, MANIFEST_NAME, DumpError, DumpReader
from splitserve.stream.dump_writer import DumpWriter
from splitserve.stream.local import LocalChannel
from splitserve.stream.p2p import FanInChannel, FanOutChannel, P2PChannel
from splitserve.stream.wire import Header, Kind, WireError, WireVersionError, decode, encode

__all__ = [
    "FORMAT",
    "MANIFEST_NAME",
    "Channel",
    "ChannelClosed",
    "ChannelMismatch",
    "ChannelSpec",
    "ChannelStats",
    "ConsumerStopped",
    "DumpError",
    "DumpReader",
    "DumpWriter",
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
