"""Compressors behind one interface, for compressed collectives and micro-benchmarks.

    from neoxlab.compress import make_compressor, decode_any
    c = make_compressor("zfp:rate=8")      # or {"name": "zfp", "rate": 8}
    buf = c.encode(x)                      # 1-D uint8, self-describing, same device as x
    y = c.decode(buf)                      # x's dtype and shape

    # fixed-size wire API (no header, no host sync) for fixed-rate codecs:
    n = c.fixed_nbytes(x.numel(), x.dtype)  # None for mpc, topk; <= raw bytes
    payload = c.encode_fixed(x)            # exactly n bytes; NaN/Inf marked inside
    y = c.decode_fixed(payload, x.numel(), x.dtype)  # flat; out= decodes in place

Families: none/fp16/bf16 (casts), int8/int4 (blockwise quantization), topk, zfp (ZFP
fixed rate in torch, bit-identical to zfpy; ``zfp:impl=zfpy`` runs the ZFP library),
mpc (lossless). The interface and each codec's stated facts: base.py; the wire header:
wire.py; codecs by name: registry.py. A codec is one file here: every module of this
package with a top-level ``@register(...)`` is imported below, so adding a codec is adding
its file.
"""

import importlib
import re
from pathlib import Path

from neoxlab.compress.base import CompressionConfigError, Compressor, CompressorStats
from neoxlab.compress.registry import available, decode_any, make_compressor, parse_spec
from neoxlab.compress.wire import WireFormatError, encoded_nbytes

_REGISTERS = re.compile(r"^@register\(", re.MULTILINE)


def _import_codecs() -> None:
    """Import every codec module of this package (found by its @register decorator, so
    helper modules such as the Triton kernels are not imported here), in file order."""
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if not path.stem.startswith("_") and _REGISTERS.search(path.read_text()):
            importlib.import_module(f"{__name__}.{path.stem}")


_import_codecs()

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
