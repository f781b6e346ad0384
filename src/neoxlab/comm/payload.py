"""A compressor bound to one chunk shape: fixed-size payloads where the codec has them.

Fixed-rate codecs (``Compressor.fixed_nbytes`` not None) encode a chunk of a given numel and
dtype into exactly that many bytes, on the chunk's device and without a host sync, so a
collective sizes every buffer in advance and needs no size exchange. Data-dependent codecs
(mpc, topk) produce self-describing buffers of varying size; collectives then exchange sizes
first, in tensors on the payload's device.
"""

from __future__ import annotations

import torch

from neoxlab.comm.strict import codec_scope
from neoxlab.compress import Compressor


class ChunkCodec:
    """Encode/decode flat chunks of `numel` elements of `dtype` with compressor `c`."""

    def __init__(self, c: Compressor, numel: int, dtype: torch.dtype):
        self.c, self.numel, self.dtype = c, numel, dtype
        sizer = getattr(c, "fixed_nbytes", None)
        self.fixed: int | None = sizer(numel, dtype) if sizer is not None else None

    def encode(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The payload of flat chunk x (written into `out` when the size is fixed)."""
        with codec_scope():
            if self.fixed is not None:
                return self.c.encode_fixed(x, out=out)
            return self.c.encode(x)

    def decode(self, payload: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Decode into the flat tensor `out` (of numel elements) and return it."""
        with codec_scope():
            if self.fixed is not None:
                result = self.c.decode_fixed(payload, self.numel, self.dtype, out=out)
            else:
                result = self.c.decode(payload)
        if result is not out:  # a variable-size codec, or one that ignored `out`
            out.copy_(result.reshape(-1))
        return out
