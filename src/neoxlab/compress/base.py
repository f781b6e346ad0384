"""The compressor interface, its wire header and the shared encode/decode path.

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
``encoded_nbytes(buf)`` tells the exact wire size from the header alone.

Fixed-size payloads (``fixed_nbytes``/``encode_fixed``/``decode_fixed``): fixed-rate codecs
(zfp, int8/int4, fp16/bf16, none) also write a bare payload whose size is a function of
numel, dtype and the codec's parameters, so a collective can allocate receive buffers
without a size exchange and decode without reading a header on the host. These calls
never synchronise with the host; NaN/Inf are marked inside the payload instead of sending
the message raw. Dtypes a codec does not compress travel raw in it.

Codecs compress fp32, fp16 and bf16 (mpc and none also fp64); every other dtype passes
through untouched. A body is never larger than the raw tensor: when compressing would not
shrink the message (tiny tensors, incompressible data) or would change values it must not
(NaN/Inf into a lossy codec), the raw bytes are sent with the PASSTHROUGH flag and counted
in ``stats.passthrough``. Hence ``max_encoded_bytes = header + numel * itemsize`` for
every compressor (``none`` sends its raw body without the flag).
"""

from __future__ import annotations

import math
import struct
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch

MAGIC = b"NX"
FORMAT_VERSION = 1
FLAG_PASSTHROUGH = 1
HEADER_FIXED = 16
DEFAULT_MAX_NDIM = 8
_FIXED = struct.Struct("<2sBBBBBBII")

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

_DTYPE_NAMES = [
    "float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8",
    "uint8", "bool", "complex64", "complex128", "uint16", "uint32", "uint64",
    "float8_e4m3fn", "float8_e5m2", "complex32",
]
DTYPE_CODES: dict[torch.dtype, int] = {
    getattr(torch, n): i + 1 for i, n in enumerate(_DTYPE_NAMES) if hasattr(torch, n)
}
CODE_DTYPES: dict[int, torch.dtype] = {c: d for d, c in DTYPE_CODES.items()}


class CompressionConfigError(ValueError):
    """Unknown compressor name or bad parameter; the message names value, rule and fix."""


class WireFormatError(ValueError):
    """A buffer that is not a valid neoxlab compressed message."""


@dataclass
class CompressorStats:
    """Per-instance counters; collectives sum them into their communication accounting."""

    calls: int = 0  # encode calls
    decodes: int = 0  # decode calls
    bytes_in: int = 0  # raw bytes given to encode
    bytes_out: int = 0  # wire bytes produced by encode, headers included
    passthrough: int = 0  # messages sent raw (NaN/Inf, non-float, tiny or incompressible)
    staged_to_host: int = 0  # device tensors copied to host for a host-only codec

    @property
    def ratio(self) -> float:
        """bytes_in / bytes_out over all encode calls (1.0 before any call)."""
        return self.bytes_in / self.bytes_out if self.bytes_out else 1.0

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, 0)


def header_nbytes(ndim: int) -> int:
    return HEADER_FIXED + 8 * ndim


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


def checked_size(c: Compressor, buf: torch.Tensor, nbytes: int) -> torch.Tensor:
    """buf, when it has the size its codec's payload_sizes announced (a collective has
    already told the receivers that size)."""
    if buf.numel() != nbytes:
        raise RuntimeError(f"{c.describe()}: the encoded message has {buf.numel()} bytes, its "
                           f"payload_sizes said {nbytes}; the two must agree (a codec bug)")
    return buf


def host_bytes(data: bytes, device: torch.device) -> torch.Tensor:
    """`data` as a uint8 host tensor to copy to `device`: pinned for a CUDA device, so that
    a non-blocking copy is queued without waiting for the device (a copy from pageable
    memory synchronizes the stream)."""
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return t.pin_memory() if device.type == "cuda" else t


def encoded_nbytes(buf: torch.Tensor) -> int:
    """Exact wire size of the message at the start of buf (header + body), from its header."""
    hdr, body = Header.parse(buf)
    return hdr.nbytes + body.numel()


def view_as(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Reinterpret a 1-D uint8 slice as dtype, copying first only if it is misaligned."""
    if raw.storage_offset() % dtype.itemsize:
        raw = raw.clone()
    return raw.view(dtype)


def raw_bytes(x: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor as a flat uint8 view (no copy)."""
    return x.reshape(-1).view(torch.uint8)


def _payload_buffer(out: torch.Tensor | None, nbytes: int, device: torch.device,
                    what: str) -> torch.Tensor:
    """A caller's 1-D uint8 buffer of exactly nbytes on device, or a new one."""
    if out is None:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    if out.dtype != torch.uint8 or out.dim() != 1 or out.numel() != nbytes \
            or out.device != device or not out.is_contiguous():
        raise ValueError(f"{what}= must be a contiguous 1-D uint8 tensor of {nbytes} bytes on "
                         f"{device}; got {out.dtype} {list(out.shape)} on {out.device}")
    return out


def dtype_view(buf: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """A uint8 slice viewed as dtype, or None when its offset is misaligned for dtype."""
    if buf.storage_offset() % dtype.itemsize or buf.numel() % dtype.itemsize:
        return None
    return buf.view(dtype)


def finite_absmax(x: torch.Tensor) -> float | None:
    """max|x| in one pass without temporaries, or None if x holds NaN or Inf."""
    lo, hi = torch.stack(torch.aminmax(x)).float().tolist()  # one device sync
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    return max(-lo, hi)


class Compressor(ABC):
    """One codec behind the interface shared by collectives and benchmarks.

    Subclasses set ``name``, ``cid`` and ``lossless`` and implement ``_encode`` (flat,
    contiguous, non-empty input of a dtype in ``dtypes``) and ``_decode``. The base class
    does the header, passthrough of non-float/empty/incompressible/non-finite messages,
    contiguity and the statistics.
    """

    name: ClassVar[str]
    cid: ClassVar[int]
    lossless: ClassVar[bool] = False
    dtypes: ClassVar[tuple[torch.dtype, ...]] = FLOAT_DTYPES
    requires: ClassVar[tuple[str, ...]] = ()  # importable modules the codec needs
    gain_required: ClassVar[bool] = True  # send raw when the body would not be smaller

    def __init__(self, **unknown: Any) -> None:
        if unknown:
            names = ", ".join(f"{k}={v!r}" for k, v in unknown.items())
            raise CompressionConfigError(
                f"{self.name} does not take parameter(s) {names}: allowed are "
                f"{self.param_names() or 'none'}; use e.g. {self.example()}")
        self.stats = CompressorStats()

    # -- description -------------------------------------------------------------------
    @classmethod
    def param_names(cls) -> list[str]:
        return []

    @classmethod
    def example(cls) -> str:
        return cls.name

    def params(self) -> dict[str, Any]:
        return {}

    def describe(self) -> str:
        p = self.params()
        inner = ",".join(f"{k}={v}" for k, v in p.items())
        return f"{self.name}({inner})" if p else self.name

    def __repr__(self) -> str:
        return f"<Compressor {self.describe()}>"

    # -- sizes -------------------------------------------------------------------------
    def max_encoded_bytes(self, numel: int, dtype: torch.dtype,
                          ndim: int = DEFAULT_MAX_NDIM) -> int:
        """Upper bound of ``encode(x).numel()`` for any x with this numel, dtype and at most
        ``ndim`` dimensions (bodies never exceed the raw bytes; see module docstring)."""
        return header_nbytes(ndim) + numel * dtype.itemsize

    def _fixed_body_nbytes(self, numel: int, dtype: torch.dtype) -> int | None:
        """Exact body size when it does not depend on the data (lets encode skip work)."""
        return self.coded_nbytes(numel, dtype) if dtype in self.dtypes else None

    # -- fixed-size wire API (no header; the receiver knows numel, dtype, parameters) ---
    def coded_nbytes(self, numel: int, dtype: torch.dtype) -> int | None:
        """Bytes of this codec's own coding of numel values of a dtype in ``dtypes``
        (fixed-rate codecs); None for data-dependent ones (mpc, topk)."""
        return None

    def fixed_nbytes(self, numel: int, dtype: torch.dtype) -> int | None:
        """Exact payload bytes of ``encode_fixed`` for fixed-rate codecs (zfp, int8/int4,
        fp16/bf16, none); None for data-dependent ones (mpc, topk). The payload is the
        coded values when that is smaller than the raw bytes, else the raw bytes (dtypes
        the codec does not compress, rates that cannot shrink a dtype such as zfp rate >=
        16 on fp16, tiny tensors): a function of numel, dtype and the parameters, so a
        receiver never needs a header, and never more than numel * itemsize."""
        coded = self.coded_nbytes(numel, dtype)
        if coded is None:
            return None
        raw = numel * dtype.itemsize
        return coded if dtype in self.dtypes and coded < raw else raw

    def shrinks(self, dtype: torch.dtype) -> bool | None:
        """Whether this codec makes large messages of dtype smaller: False means every
        such message is sent raw (e.g. zfp rate >= 16 or fp16 on fp16 data); None when it
        depends on the data (mpc, topk)."""
        if dtype not in self.dtypes:
            return False
        numel = 1 << 20
        coded = self.coded_nbytes(numel, dtype)
        return None if coded is None else coded < numel * dtype.itemsize

    def _fixed_is_raw(self, numel: int, dtype: torch.dtype) -> bool:
        if dtype not in self.dtypes:
            return True
        coded = self.coded_nbytes(numel, dtype)
        return coded is not None and coded >= numel * dtype.itemsize

    def _check_fixed(self, numel: int, dtype: torch.dtype) -> int:
        n = self.fixed_nbytes(numel, dtype)
        if n is None:
            raise CompressionConfigError(
                f"{self.describe()} has data-dependent sizes: fixed_nbytes is None, so "
                "encode_fixed/decode_fixed do not apply; use encode/decode (self-describing) "
                "or a fixed-rate codec (zfp, int8, int4, fp16, bf16, none)")
        return n

    def encode_fixed(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """1-D uint8 payload of exactly ``fixed_nbytes(x.numel(), x.dtype)`` bytes on
        x.device, without a header and without any host synchronisation. NaN/Inf are marked
        inside the payload (the affected values or blocks decode non-finite), never silently
        turned into finite numbers. ``out`` (1-D uint8 of that size) avoids an allocation."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{self.name}.encode_fixed expects a torch.Tensor, "
                            f"got {type(x).__name__}")
        nbytes = self._check_fixed(x.numel(), x.dtype)
        out = _payload_buffer(out, nbytes, x.device, "out")
        flat = x.detach().contiguous().reshape(-1)
        self.stats.calls += 1
        self.stats.bytes_in += flat.numel() * flat.element_size()
        self.stats.bytes_out += nbytes
        if flat.numel():
            if self._fixed_is_raw(flat.numel(), x.dtype):
                self.stats.passthrough += x.dtype in self.dtypes and self.name != "none"
                out.copy_(raw_bytes(flat))
            else:
                self._encode_fixed(flat, out)
        return out

    def decode_fixed(self, payload: torch.Tensor, numel: int, dtype: torch.dtype,
                     out: torch.Tensor | None = None) -> torch.Tensor:
        """Flat tensor (numel, dtype) on payload.device from an ``encode_fixed`` payload;
        ``out`` (contiguous, numel elements of dtype) lets a caller decode into its own
        buffer. Payload bytes past ``fixed_nbytes`` are ignored."""
        nbytes = self._check_fixed(numel, dtype)
        if (not isinstance(payload, torch.Tensor) or payload.dtype != torch.uint8
                or payload.dim() != 1 or payload.numel() < nbytes):
            raise WireFormatError(
                f"{self.describe()}.decode_fixed needs a 1-D uint8 payload of at least "
                f"{nbytes} bytes for {numel} {dtype} values; got "
                f"{getattr(payload, 'dtype', type(payload).__name__)} "
                f"{list(getattr(payload, 'shape', []))}")
        if out is None:
            out = torch.empty(numel, dtype=dtype, device=payload.device)
        elif (out.dtype != dtype or out.numel() != numel or not out.is_contiguous()
              or out.device != payload.device):
            raise ValueError(f"decode_fixed out= must be a contiguous {dtype} tensor of "
                             f"{numel} elements on {payload.device}; got {out.dtype} "
                             f"{list(out.shape)} on {out.device}")
        self.stats.decodes += 1
        if numel:
            flat = out.view(-1)
            if self._fixed_is_raw(numel, dtype):
                raw_bytes(flat).copy_(payload[:nbytes])
            else:
                self._decode_fixed(payload[:nbytes].contiguous(), flat)
        return out

    def _encode_fixed(self, flat: torch.Tensor, out: torch.Tensor) -> None:
        """Write the payload of a non-empty flat tensor of a dtype in ``dtypes`` to out."""
        raise NotImplementedError(f"{self.name} has no fixed-size payload")

    def _decode_fixed(self, payload: torch.Tensor, out: torch.Tensor) -> None:
        """Fill the flat, contiguous, non-empty out from exactly fixed_nbytes bytes."""
        raise NotImplementedError(f"{self.name} has no fixed-size payload")

    def _header_param(self, numel: int) -> int:
        return 0

    # -- encode / decode ---------------------------------------------------------------
    def encode(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{self.name}.encode expects a torch.Tensor, got {type(x).__name__}")
        x = x.detach()
        raw_n = x.numel() * x.element_size()
        self.stats.calls += 1
        self.stats.bytes_in += raw_n
        hdr = Header(self.cid, x.dtype, tuple(x.shape))
        flat = x.contiguous().reshape(-1)
        buf = None
        if x.dtype in self.dtypes and x.numel() > 0:
            fixed = self._fixed_body_nbytes(x.numel(), x.dtype)
            if fixed is None or fixed < raw_n or not self.gain_required:
                hdr.param = self._header_param(x.numel())
                buf = self._encode(flat, hdr)
                no_gain = buf is not None and buf.numel() - hdr.nbytes >= raw_n
                if no_gain and self.gain_required:
                    buf = None
        if buf is None:
            buf = self._passthrough(flat, hdr)
        self.stats.bytes_out += buf.numel()
        return buf

    def payload_sizes(self, count: int, load: Callable[[int], torch.Tensor]) -> torch.Tensor:
        """encode()'s sizes of `count` messages loaded by load(i), as an int64 tensor on
        their device. A collective reads a whole call's sizes in one host sync and then
        encodes each message with encode_sized. Codecs with data-dependent sizes override
        it to size without a host sync; this one encodes each message."""
        sizes = [self.encode(load(i)).numel() for i in range(count)]
        device = load(0).device if count else torch.device("cpu")
        return torch.tensor(sizes, dtype=torch.int64, device=device)

    def encode_sized(self, x: torch.Tensor, nbytes: int) -> torch.Tensor:
        """encode(x) for a caller that knows its size already (payload_sizes, read on the
        host): codecs with data-dependent sizes override it to skip their host sync."""
        return checked_size(self, self.encode(x), nbytes)

    def decode_sized(self, buf: torch.Tensor, shape: tuple[int, ...],
                     dtype: torch.dtype) -> torch.Tensor:
        """decode() for a receiver that knows the message's shape and dtype and holds
        exactly its bytes (buf.numel(), host metadata, is its wire size): the header is not
        read on the host, so a device buffer decodes without a host sync. For codecs whose
        compressed bodies are always smaller than the raw bytes (gain_required), a body of
        the raw size is the passthrough. The header is trusted here, not checked: use
        decode() for buffers of unknown origin."""
        if not self.gain_required:
            return self.decode(buf)
        numel = math.prod(shape)
        raw_n, hlen = numel * dtype.itemsize, header_nbytes(len(shape))
        if buf.dim() != 1 or buf.numel() < hlen or buf.numel() - hlen > raw_n:
            raise WireFormatError(f"{self.name}: a message of {buf.numel()} bytes cannot hold "
                                  f"{dtype} {list(shape)} (header {hlen}, raw body {raw_n})")
        body = buf[hlen:]
        self.stats.decodes += 1
        if body.numel() == raw_n or dtype not in self.dtypes:
            return view_as(body, dtype).clone().reshape(shape)
        hdr = Header(self.cid, dtype, tuple(shape), param=self._header_param(numel))
        return self._decode(body, hdr).reshape(shape)

    def _passthrough(self, flat: torch.Tensor, hdr: Header) -> torch.Tensor:
        self.stats.passthrough += 1
        hdr.flags |= FLAG_PASSTHROUGH
        hdr.param = 0
        buf, body = hdr.alloc(flat.numel() * flat.element_size(), flat.device)
        if flat.numel():
            body.copy_(raw_bytes(flat))
        return buf

    def decode(self, buf: torch.Tensor) -> torch.Tensor:
        hdr, body = Header.parse(buf)
        self.stats.decodes += 1
        if hdr.passthrough:
            n = hdr.numel * hdr.dtype.itemsize
            if body.numel() != n:
                raise WireFormatError(f"passthrough body has {body.numel()} bytes, "
                                      f"expected {n} for {hdr.dtype} {list(hdr.shape)}")
            return view_as(body, hdr.dtype).clone().reshape(hdr.shape)
        if hdr.cid != self.cid:
            raise WireFormatError(f"buffer was encoded by compressor id {hdr.cid}, not by "
                                  f"{self.name} (id {self.cid}); use decode_any")
        return self._decode(body, hdr).reshape(hdr.shape)

    @abstractmethod
    def _encode(self, flat: torch.Tensor, hdr: Header) -> torch.Tensor | None:
        """Return the full wire buffer (header via hdr.alloc/join) or None to pass through."""

    @abstractmethod
    def _decode(self, body: torch.Tensor, hdr: Header) -> torch.Tensor:
        """Rebuild the flat tensor of hdr.dtype from a non-passthrough body."""


def check_int(comp: str, name: str, value: Any, lo: int, hi: int, example: str) -> int:
    """Validate an integer parameter; the error names the value, the rule and a fix."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise CompressionConfigError(
            f"{comp} {name}={value!r} is not an integer: {name} must be an integer in "
            f"[{lo}, {hi}]; use e.g. {example}")
    if not lo <= value <= hi:
        raise CompressionConfigError(
            f"{comp} {name}={value!r} is out of range: {name} must be an integer in "
            f"[{lo}, {hi}]; use e.g. {example}")
    return value
