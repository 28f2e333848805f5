"""A `HiddenRecord` as tensors a point-to-point transport can move: one header, then a payload.

The header is a fixed-length int64 tensor, so a receiver can always post its receive before it
knows anything about the message; the header then says how long the payload is. Layout:

    index  field
    0      MAGIC (catches a peer that is not speaking this protocol at all)
    1      SCHEMA_VERSION of the sender
    2      kind: RECORD, END (producer has no more data), ERROR (producer failed), HELLO
    3      sample_id
    4      num_tokens T (ERROR: message length in bytes; HELLO: the consumer's max_tokens)
    5      aux_dim (m*D)
    6      hidden (D)
    7      dtype code of aux/final on the wire
    8      credits (HELLO only)
    9..15  spare, zero

A RECORD's payload, in sending order (T tokens, m captured layers of width D):

    input_ids (T,)        int64
    loss_mask (T,)        uint8   (bool is not a dtype every backend sends)
    aux       (T, m*D)    wire dtype (float32 or bfloat16)
    final     (T, D)      wire dtype

An ERROR's payload is one uint8 tensor holding the UTF-8 message; END and HELLO have none.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import torch

from splitserve.records import SCHEMA_VERSION, HiddenRecord

HEADER_LEN = 16
HEADER_NBYTES = HEADER_LEN * 8  # int64
MAGIC = 0x53504C54  # "SPLT"
# Error text is for a human reading a traceback; capping it keeps the message a fixed, small cost.
MAX_ERROR_BYTES = 4096

_DTYPE_CODES = {torch.float32: 1, torch.bfloat16: 2}
_CODE_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}


class Kind(IntEnum):
    RECORD = 1
    END = 2
    ERROR = 3
    HELLO = 4


class WireError(RuntimeError):
    """A message that this side cannot make sense of (wrong magic, kind, or shape)."""


class WireVersionError(WireError):
    """The peer was built with another record schema; mixing them would corrupt training data."""


def dtype_code(dtype: torch.dtype) -> int:
    if dtype not in _DTYPE_CODES:
        supported = ", ".join(str(d) for d in _DTYPE_CODES)
        raise ValueError(f"wire dtype {dtype} is not supported (supported: {supported})")
    return _DTYPE_CODES[dtype]


def dtype_from_code(code: int) -> torch.dtype:
    if code not in _CODE_DTYPES:
        raise WireError(f"unknown wire dtype code {code}")
    return _CODE_DTYPES[code]


@dataclass(frozen=True)
class Header:
    """The decoded header; fields a kind does not use stay at their defaults."""

    kind: Kind
    sample_id: int = -1
    num_tokens: int = 0
    aux_dim: int = 0
    hidden: int = 0
    dtype: torch.dtype | None = None
    credits: int = 0

    def to_tensor(self, device: torch.device | str | None = None) -> torch.Tensor:
        """(HEADER_LEN,) int64."""
        values = [0] * HEADER_LEN
        values[:9] = [
            MAGIC,
            SCHEMA_VERSION,
            int(self.kind),
            self.sample_id,
            self.num_tokens,
            self.aux_dim,
            self.hidden,
            0 if self.dtype is None else dtype_code(self.dtype),
            self.credits,
        ]
        return torch.tensor(values, dtype=torch.int64, device=device)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> Header:
        if t.shape != (HEADER_LEN,) or t.dtype != torch.int64:
            raise WireError(f"a header is ({HEADER_LEN},) int64, got {tuple(t.shape)} {t.dtype}")
        v = t.tolist()  # one device->host copy, whatever device the header was received on
        if v[0] != MAGIC:
            raise WireError(f"not a splitserve record header (magic {v[0]:#x}, expected {MAGIC:#x})")
        if v[1] != SCHEMA_VERSION:
            raise WireVersionError(
                f"peer sends record schema_version {v[1]}, this process speaks schema_version "
                f"{SCHEMA_VERSION}: run producers and consumers from the same splitserve version"
            )
        try:
            kind = Kind(v[2])
        except ValueError:
            raise WireError(f"unknown message kind {v[2]}") from None
        return cls(
            kind=kind,
            sample_id=v[3],
            num_tokens=v[4],
            aux_dim=v[5],
            hidden=v[6],
            dtype=dtype_from_code(v[7]) if v[7] else None,
            credits=v[8],
        )


def payload_shapes(header: Header) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of each payload tensor, in sending order."""
    if header.kind == Kind.RECORD:
        assert header.dtype is not None
        t = header.num_tokens
        return [
            ((t,), torch.int64),
            ((t,), torch.uint8),
            ((t, header.aux_dim), header.dtype),
            ((t, header.hidden), header.dtype),
        ]
    if header.kind == Kind.ERROR:
        return [((header.num_tokens,), torch.uint8)]
    return []


def payload_nbytes(header: Header) -> int:
    total = 0
    for shape, dtype in payload_shapes(header):
        n = 1
        for s in shape:
            n *= s
        total += n * dtype.itemsize
    return total


def encode(
    record: HiddenRecord, dtype: torch.dtype, device: torch.device | str | None = None
) -> tuple[Header, list[torch.Tensor]]:
    """The header and contiguous payload tensors of a record, on `device`, aux/final in `dtype`.

    Tensors already in the right dtype, device and layout are passed through, not copied, so
    they must not be changed in place until the transport has sent them.
    """
    dtype_code(dtype)  # reject an unsupported wire dtype before touching any data
    if record.aux.ndim != 2 or record.final.ndim != 2:
        raise ValueError(
            f"record {record.sample_id}: aux and final must be 2-D (T, width), got "
            f"aux={tuple(record.aux.shape)} final={tuple(record.final.shape)}"
        )
    header = Header(
        kind=Kind.RECORD,
        sample_id=int(record.sample_id),
        num_tokens=record.num_tokens,
        aux_dim=int(record.aux.shape[1]),
        hidden=int(record.final.shape[1]),
        dtype=dtype,
    )
    payload = [
        record.input_ids.to(device=device, dtype=torch.int64).contiguous(),
        record.loss_mask.to(device=device, dtype=torch.uint8).contiguous(),
        record.aux.to(device=device, dtype=dtype).contiguous(),
        record.final.to(device=device, dtype=dtype).contiguous(),
    ]
    return header, payload


def decode(header: Header, payload: list[torch.Tensor]) -> HiddenRecord:
    """Rebuild a record from a RECORD header and its payload tensors (shapes as in the header);
    the record keeps the payload's memory (receivers allocate fresh tensors per message)."""
    if header.kind != Kind.RECORD:
        raise WireError(f"cannot decode a {header.kind.name} message as a record")
    want = payload_shapes(header)
    got = [(tuple(p.shape), p.dtype) for p in payload]
    if got != want:
        raise WireError(f"record {header.sample_id}: payload {got} does not match its header {want}")
    ids, mask, aux, final = payload
    return HiddenRecord(
        sample_id=header.sample_id,
        input_ids=ids,
        loss_mask=mask.bool(),  # always a fresh tensor
        aux=aux,
        final=final,
    )


def error_payload(
    message: str, device: torch.device | str | None = None
) -> tuple[Header, list[torch.Tensor]]:
    """An ERROR header and its payload: the message as UTF-8 bytes, cut to MAX_ERROR_BYTES."""
    data = message.encode("utf-8")[:MAX_ERROR_BYTES]
    buf = torch.tensor(list(data), dtype=torch.uint8, device=device)
    return Header(kind=Kind.ERROR, num_tokens=len(data)), [buf]


def error_message(payload: list[torch.Tensor]) -> str:
    return bytes(payload[0].cpu().tolist()).decode("utf-8", errors="replace")
