"""A compressor bound to one chunk shape: fixed-size payloads where the codec has them.

Fixed-rate codecs (``Compressor.fixed_nbytes`` not None) encode a chunk of a given numel and
dtype into exactly that many bytes, on the chunk's device and without a host sync, so a
collective sizes every buffer in advance and needs no size exchange. Data-dependent codecs
(mpc, topk) produce self-describing buffers of varying size: a collective first sizes every
chunk of the call on the device (``sizes``), exchanges the size table by a fixed-size
collective, reads it on the host once, then encodes each chunk knowing its size
(``encode_sized``) and decodes knowing where each payload ends: no other host sync.
"""

from __future__ import annotations

from collections.abc import Callable

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
            return self.c.encode(x.reshape(-1))

    def sizes(self, count: int, load: Callable[[int], torch.Tensor]) -> torch.Tensor:
        """The payload sizes of `count` flat chunks of a variable-size codec, as an int64
        tensor on their device (no host sync)."""
        with codec_scope():
            return self.c.payload_sizes(count, lambda i: load(i).reshape(-1))

    def encode_sized(self, x: torch.Tensor, nbytes: int) -> torch.Tensor:
        """The payload of flat chunk x of a variable-size codec, whose size `sizes` gave
        and the host has read (no host sync)."""
        with codec_scope():
            return self.c.encode_sized(x.reshape(-1), nbytes)

    def decode(self, payload: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Decode into the flat tensor `out` (of numel elements) and return it. A
        variable-size payload must be exactly one message (its size came from the size
        exchange); its header is then not read on the host."""
        with codec_scope():
            if self.fixed is not None:
                result = self.c.decode_fixed(payload, self.numel, self.dtype, out=out)
            else:
                result = self.c.decode_sized(payload, (self.numel,), self.dtype)
        if result is not out:  # a variable-size codec, or one that ignored `out`
            out.copy_(result.reshape(-1))
        return out
