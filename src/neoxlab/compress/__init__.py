"""Compressors behind one interface, for compressed collectives and micro-benchmarks.

    from neoxlab.compress import make_compressor, decode_any
    c = make_compressor("zfp:rate=8")      # or {"name": "zfp", "rate": 8}
    buf = c.encode(x)                      # 1-D uint8, self-describing, same device as x
    y = c.decode(buf)                      # x's dtype and shape

Families: none/fp16/bf16 (casts), int8/int4 (blockwise quantization), topk, zfp (ZFP
library via zfpy, host-staged), mpc (lossless). See base.py for the wire format.
"""

from neoxlab.compress import casts, mpc, quant, topk, zfp  # noqa: F401  (registration)
from neoxlab.compress.base import (
    CompressionConfigError,
    Compressor,
    CompressorStats,
    WireFormatError,
    encoded_nbytes,
)
from neoxlab.compress.registry import available, decode_any, make_compressor, parse_spec

__all__ = [
    "CompressionConfigError",
    "Compressor",
    "CompressorStats",
    "WireFormatError",
    "available",
    "decode_any",
    "encoded_nbytes",
    "make_compressor",
    "parse_spec",
]
