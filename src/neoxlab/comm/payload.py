"""A compressor bound to one chunk shape: fixed-size payloads where the codec has them.

Fixed-rate codecs (``Compressor.fixed_nbytes`` not None) encode a chunk of a given numel and
dtype into exactly that many bytes, on the chunk's device and without a host sync, so a
collective sizes every buffer in advance and needs no size exchange. Data-dependent codecs
(mpc, topk) produce self-describing buffers of varying size: a collective first sizes every
chunk of the call on the device (``sizes``), exchanges the size table by a fixed-size
collective, reads it on the host once, then encodes each chunk knowing its size
(``encode_sized``) and decodes knowing where each payload ends: no other host sync.

Equal chunks in one launch: a fixed-rate codec states its payload's layout
(``fixed_regions``: values per block, and the bytes per block of each region, e.g. int8's
scales then codes), so the payload of `count` chunks that hold whole blocks, laid end to
end, is their payloads' regions interleaved: a collective encodes (and decodes) a
segment's n chunks with one codec call instead of n (``rows``, ``encode_rows``,
``decode_rows``); a codec of one region (ZFP, casts) needs not even a copy.
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

    def rows(self, count: int) -> bool:
        """Whether `count` chunks, laid end to end, encode and decode as one call: the
        codec states its layout, a chunk holds whole blocks, and the sizes add up (a chunk
        sent raw while the whole would be coded, or the reverse, does not)."""
        layout = self._layout()
        if layout is None or count <= 1:
            return False
        block, sizes = layout
        return (self.numel % block == 0 and self.fixed == self.numel // block * sum(sizes)
                and self.c.fixed_nbytes(count * self.numel, self.dtype) == count * self.fixed)

    def encode_rows(self, x: torch.Tensor, out: torch.Tensor) -> None:
        """The payloads of the chunks of flat x (count * numel values, ``rows`` true) into
        out's count slots of ``fixed`` bytes, with one codec call."""
        with codec_scope():
            regions = self._regions(out.numel() // self.fixed)
            if len(regions) == 1:
                self.c.encode_fixed(x, out=out)
                return
            whole = torch.empty_like(out)  # the regions of all chunks, each end to end
            self.c.encode_fixed(x, out=whole)
            slots, at = out.view(-1, self.fixed), 0
            for lo, hi in regions:
                width = hi - lo
                slots[:, lo:hi].copy_(whole[at: at + width * slots.shape[0]].view(-1, width))
                at += width * slots.shape[0]

    def decode_rows(self, payloads: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """count payloads end to end (``rows`` true) into the flat out of count * numel
        values, with one codec call."""
        with codec_scope():
            count = out.numel() // self.numel
            regions = self._regions(count)
            whole = payloads[: count * self.fixed]
            if len(regions) > 1:
                slots, at = whole.view(count, self.fixed), 0
                whole = torch.empty_like(whole)
                for lo, hi in regions:
                    width = hi - lo
                    whole[at: at + width * count].view(count, width).copy_(slots[:, lo:hi])
                    at += width * count
            return self.c.decode_fixed(whole, out.numel(), self.dtype, out=out)

    def _layout(self) -> tuple[int, tuple[int, ...]] | None:
        """(values per block, bytes per block of each payload region), or None."""
        if self.fixed is None:
            return None
        if self.fixed == self.numel * self.dtype.itemsize:  # sent raw: value after value
            return 1, (self.dtype.itemsize,)
        layout = getattr(self.c, "fixed_regions", None)
        return None if layout is None else layout(self.dtype)

    def _regions(self, count: int) -> list[tuple[int, int]]:
        """[lo, hi) bytes of each region within one chunk's payload."""
        layout = self._layout()
        assert layout is not None, "rows() first"
        block, sizes = layout
        out, at = [], 0
        for size in sizes:
            out.append((at, at + self.numel // block * size))
            at = out[-1][1]
        return out

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


def joined(payloads: list[torch.Tensor]) -> torch.Tensor | None:
    """The payloads as one tensor when they lie end to end in one buffer (the slots of a
    fixed-size exchange or gather), else None: a view, nothing copied."""
    first = payloads[0]
    size = first.numel()
    at = first.data_ptr()
    for i, p in enumerate(payloads):
        if p.numel() != size or p.data_ptr() != at + i * size or not p.is_contiguous():
            return None
    return first.as_strided((size * len(payloads),), (1,), first.storage_offset())
