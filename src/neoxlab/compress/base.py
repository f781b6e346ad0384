"""The compressor interface: what every codec does and states about itself.

A codec is one file in compress/: a ``Compressor`` subclass registered by name
(registry.register). Besides encoding and decoding it states its facts, which the rest of
neoxlab asks instead of comparing codec names: its wire size per dtype (``coded_nbytes``,
``fixed_nbytes``, ``wire_bits``), whether it shrinks a dtype (``shrinks``), its kernel paths
(``kernels``), the profile entry that prices it (``cost_class``), the specs calibration
times (``calibration``) and the tuner's candidates (``tune_specs``).

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
every compressor (``none`` sends its raw body without the flag). The header: wire.py.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch

from neoxlab.compress.wire import (
    DEFAULT_MAX_NDIM,
    FLAG_PASSTHROUGH,
    Header,
    WireFormatError,
    header_nbytes,
    raw_bytes,
    view_as,
)

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# values in a "large" message: a multiple of every block size (ZFP's 16, int8's blocks up
# to 2^20), so a fixed-rate codec's bits per value come out exact (wire_bits)
LARGE_NUMEL = 1 << 20
# the dtype of a value width, for callers that know only bits per value (the model)
WIDTH_DTYPES = {16: torch.float16, 32: torch.float32, 64: torch.float64}


class Compressor(ABC):
    """One codec behind the interface shared by collectives and benchmarks.

    Subclasses set ``name``, ``cid`` and ``lossless`` and implement ``_encode`` (flat,
    contiguous, non-empty input of a dtype in ``dtypes``) and ``_decode``. The base class
    does the header, passthrough of non-float/empty/incompressible/non-finite messages,
    contiguity and the statistics.
    """

    name: ClassVar[str]  # set by registry.register
    cid: ClassVar[int]  # the header's compressor id, set by registry.register
    lossless: ClassVar[bool] = False
    dtypes: ClassVar[tuple[torch.dtype, ...]] = FLOAT_DTYPES
    requires: ClassVar[tuple[str, ...]] = ()  # importable modules the codec needs
    gain_required: ClassVar[bool] = True  # send raw when the body would not be smaller
    # the paths it runs: "torch" (tensor ops, any device), "triton" (fused kernels on CUDA,
    # kernels.py picks); a GPU without Triton (Lassen's ppc64le) prices a fused codec at its
    # torch-ops throughput (perfmodel.predict.kernel_profile)
    kernels: ClassVar[tuple[str, ...]] = ("torch",)
    # the cluster profile's codecs entry that prices it when the profile has none of its
    # own (a codec doing the same passes over the data); None: only its own name
    cost_class: ClassVar[str | None] = None
    # (profile key, spec timed) that calibration measures for this codec
    calibration: ClassVar[tuple[tuple[str, str], ...]] = ()
    # specs task=tune tries on every compressible dimension (tune.codecs empty: all codecs')
    tune_specs: ClassVar[tuple[str, ...]] = ()

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

    def wire_bits(self, dtype: torch.dtype) -> float | None:
        """Bits per value of this codec's own coding of a large message of dtype (None when
        the size depends on the data): what the performance model prices, and more than
        the dtype's width when the codec cannot shrink it (then ``shrinks`` is False and
        the message travels raw)."""
        coded = self.coded_nbytes(LARGE_NUMEL, dtype)
        return None if coded is None else 8 * coded / LARGE_NUMEL

    @classmethod
    def fused(cls) -> bool:
        """Whether it has fused GPU kernels besides its torch-ops path."""
        return "triton" in cls.kernels

    def shrinks(self, dtype: torch.dtype) -> bool | None:
        """Whether this codec makes large messages of dtype smaller: False means every
        such message is sent raw (e.g. zfp rate >= 16 or fp16 on fp16 data); None when it
        depends on the data (mpc, topk)."""
        if dtype not in self.dtypes:
            return False
        numel = LARGE_NUMEL
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


class CompressionConfigError(ValueError):
    """Unknown compressor name or bad parameter; the message names value, rule and fix."""


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


def checked_size(c: Compressor, buf: torch.Tensor, nbytes: int) -> torch.Tensor:
    """buf, when it has the size its codec's payload_sizes announced (a collective has
    already told the receivers that size)."""
    if buf.numel() != nbytes:
        raise RuntimeError(f"{c.describe()}: the encoded message has {buf.numel()} bytes, its "
                           f"payload_sizes said {nbytes}; the two must agree (a codec bug)")
    return buf


def finite_absmax(x: torch.Tensor) -> float | None:
    """max|x| in one pass without temporaries, or None if x holds NaN or Inf."""
    try:
        lo, hi = torch.aminmax(x)
    except RuntimeError:  # torch < 2.2 (the oldest supported set) has no CPU aminmax for fp16
        lo, hi = x.min(), x.max()
    lo, hi = torch.stack((lo, hi)).float().tolist()  # one device sync
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    return max(-lo, hi)


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
