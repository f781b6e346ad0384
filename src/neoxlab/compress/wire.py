"""The wire format of a self-describing compressed message: its header, and byte views.

Every compressor produces a self-describing 1-D uint8 buffer so that a receiver (or
``decode_any``) can rebuild the tensor without out-of-band metadata, and so that a
collective can size its receive buffers from ``max_encoded_bytes`` alone.

Wire format (little-endian), version 1::

    off  size  field
      0     2  magic b"NX"
      2     1  format version (1)
      3     1  compressor id (registry)
      4     1  original dtype code (DTYPE_CODES)
      5     1  flags (bit 0: PASSTHROUGH, body is the raw tensor bytes)
      6     1  ndim (0..255)
      7     1  body length, bits 32..39
      8     4  u32 compressor parameter (zfp rate, block, mpc dim, topk k; 0 if none)
     12     4  body length, bits 0..31
     16  8*nd  shape, one int64 per dimension
    ...        body (starts 8-byte aligned)

The body length makes a message self-delimiting: ``decode`` accepts a buffer with trailing
bytes (e.g. a slot of ``max_encoded_bytes`` filled by a padded all-gather), and
``encoded_nbytes(buf)`` tells the exact wire size from the header alone. What goes in a
body is each codec's own (base.py: the interface; one file per codec).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import torch

MAGIC = b"NX"
FORMAT_VERSION = 1
FLAG_PASSTHROUGH = 1
HEADER_FIXED = 16
DEFAULT_MAX_NDIM = 8
_FIXED = struct.Struct("<2sBBBBBBII")

_DTYPE_NAMES = [
    "float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8",
    "uint8", "bool", "complex64", "complex128", "uint16", "uint32", "uint64",
    "float8_e4m3fn", "float8_e5m2", "complex32",
]
DTYPE_CODES: dict[torch.dtype, int] = {
    getattr(torch, n): i + 1 for i, n in enumerate(_DTYPE_NAMES) if hasattr(torch, n)
}
CODE_DTYPES: dict[int, torch.dtype] = {c: d for d, c in DTYPE_CODES.items()}


@dataclass
class Header:
    cid: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    param: int = 0
    flags: int = 0

    @property
    def nbytes(self) -> int:
        return header_nbytes(len(self.shape))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def passthrough(self) -> bool:
        return bool(self.flags & FLAG_PASSTHROUGH)

    def pack(self, body_nbytes: int) -> bytes:
        if len(self.shape) > 255:
            raise WireFormatError(f"ndim={len(self.shape)} exceeds the wire limit of 255")
        if body_nbytes >= 1 << 40:
            raise WireFormatError(f"body of {body_nbytes} bytes exceeds the wire limit of 1 TiB")
        fixed = _FIXED.pack(MAGIC, FORMAT_VERSION, self.cid, DTYPE_CODES[self.dtype],
                            self.flags, len(self.shape), body_nbytes >> 32, self.param,
                            body_nbytes & 0xFFFFFFFF)
        return fixed + struct.pack(f"<{len(self.shape)}q", *self.shape)

    def alloc(self, body_nbytes: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Allocate the whole wire buffer with the header written; return (buf, body view)."""
        head = self.pack(body_nbytes)
        buf = torch.empty(len(head) + body_nbytes, dtype=torch.uint8, device=device)
        buf[: len(head)].copy_(host_bytes(head, device), non_blocking=True)
        return buf, buf[len(head):]

    def join(self, *parts: torch.Tensor) -> torch.Tensor:
        """Header followed by the given uint8 parts, in one buffer on the parts' device."""
        device = parts[0].device
        buf, body = self.alloc(sum(p.numel() for p in parts), device)
        off = 0
        for p in parts:
            body[off: off + p.numel()].copy_(p)
            off += p.numel()
        return buf

    @classmethod
    def parse(cls, buf: torch.Tensor) -> tuple[Header, torch.Tensor]:
        """Read the header of a wire buffer; return it and the body (a view of buf, without
        any trailing bytes)."""
        if not isinstance(buf, torch.Tensor) or buf.dtype != torch.uint8 or buf.dim() != 1:
            raise WireFormatError("a wire buffer must be a 1-D torch.uint8 tensor")
        if buf.numel() < HEADER_FIXED:
            raise WireFormatError(f"buffer of {buf.numel()} bytes is shorter than a header")
        fixed = bytes(buf[:HEADER_FIXED].cpu().numpy())
        magic, ver, cid, dcode, flags, ndim, len_hi, param, len_lo = _FIXED.unpack(fixed)
        if magic != MAGIC:
            raise WireFormatError(f"bad magic {magic!r}: not a neoxlab compressed message")
        if ver != FORMAT_VERSION:
            raise WireFormatError(f"wire format version {ver} is not supported "
                                  f"(this build reads {FORMAT_VERSION})")
        if dcode not in CODE_DTYPES:
            raise WireFormatError(f"unknown dtype code {dcode} in header")
        hlen = header_nbytes(ndim)
        if buf.numel() < hlen:
            raise WireFormatError(f"buffer of {buf.numel()} bytes is shorter than its header")
        body_nbytes = len_hi << 32 | len_lo
        if buf.numel() < hlen + body_nbytes:
            raise WireFormatError(f"buffer of {buf.numel()} bytes is truncated: its header "
                                  f"announces {hlen + body_nbytes}")
        shape = struct.unpack(f"<{ndim}q", bytes(buf[HEADER_FIXED:hlen].cpu().numpy()))
        hdr = cls(cid=cid, dtype=CODE_DTYPES[dcode], shape=tuple(shape), param=param,
                  flags=flags)
        return hdr, buf[hlen: hlen + body_nbytes]


def encoded_nbytes(buf: torch.Tensor) -> int:
    """Exact wire size of the message at the start of buf (header + body), from its header."""
    hdr, body = Header.parse(buf)
    return hdr.nbytes + body.numel()


class WireFormatError(ValueError):
    """A buffer that is not a valid neoxlab compressed message."""


def header_nbytes(ndim: int) -> int:
    return HEADER_FIXED + 8 * ndim


def host_bytes(data: bytes, device: torch.device) -> torch.Tensor:
    """`data` as a uint8 host tensor to copy to `device`: pinned for a CUDA device, so that
    a non-blocking copy is queued without waiting for the device (a copy from pageable
    memory synchronizes the stream)."""
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return t.pin_memory() if device.type == "cuda" else t


def view_as(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Reinterpret a 1-D uint8 slice as dtype, copying first only if it is misaligned."""
    if raw.storage_offset() % dtype.itemsize:
        raw = raw.clone()
    return raw.view(dtype)


def raw_bytes(x: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor as a flat uint8 view (no copy)."""
    return x.reshape(-1).view(torch.uint8)


def dtype_view(buf: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """A uint8 slice viewed as dtype, or None when its offset is misaligned for dtype."""
    if buf.storage_offset() % dtype.itemsize or buf.numel() % dtype.itemsize:
        return None
    return buf.view(dtype)
