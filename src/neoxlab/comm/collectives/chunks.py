"""Cutting a message: segments of a bounded size (comm_scratch), a segment as n equal
chunks (the last zero-padded in scratch), and error feedback's residual settled per chunk."""

from __future__ import annotations

from collections.abc import Callable

import torch

from neoxlab.comm.collectives.cost import Cost, Timed
from neoxlab.comm.payload import ChunkCodec, joined
from neoxlab.comm_scratch import SEGMENT_BYTES, segment_bytes_for

# Whole-message collectives go in segments too (as all-reduce), so that their payloads and
# scratch stay a bounded fraction of the message. Segment bounds fall on multiples of
# SEGMENT_ALIGN values, so that the blocks of fixed-rate codecs (ZFP's 16 values, int8/int4
# blocks dividing 4096) are the whole message's blocks and the values do not change.
SEGMENT_ALIGN = 4096


def segments(numel: int, itemsize: int, segment_bytes: int = SEGMENT_BYTES
             ) -> list[tuple[int, int]]:
    """[lo, hi) element ranges of a message of numel values of itemsize bytes (one empty
    range for an empty message: the collective still runs on every rank)."""
    step = segment_bytes_for(numel * itemsize, segment_bytes) // max(itemsize, 1)
    step = max(SEGMENT_ALIGN, step - step % SEGMENT_ALIGN)
    return [(lo, min(lo + step, numel)) for lo in range(0, numel, step)] or [(0, 0)]


def flat_targets(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """A flat view of each tensor, or a flat buffer for one that is not contiguous."""
    return [t.view(-1) if t.is_contiguous() else torch.empty(
        t.numel(), dtype=t.dtype, device=t.device) for t in tensors]


def copy_back(tensors: list[torch.Tensor], flats: list[torch.Tensor]) -> None:
    for t, flat in zip(tensors, flats, strict=True):
        if flat.data_ptr() != t.data_ptr() or not t.is_contiguous():
            t.copy_(flat.view_as(t))


class Chunks:
    """A flat segment as n chunks of equal length (the last one zero-padded in scratch),
    each optionally plus its error-feedback residual."""

    def __init__(self, flat: torch.Tensor, n: int, residual: torch.Tensor | None):
        self.flat, self.n, self.residual = flat, n, residual
        self.length = max(1, -(-flat.numel() // n))

    def bounds(self, i: int) -> tuple[int, int]:
        lo = min(i * self.length, self.flat.numel())
        return lo, min(lo + self.length, self.flat.numel())

    def full(self, i: int) -> bool:
        lo, hi = self.bounds(i)
        return hi - lo == self.length

    def load(self, i: int) -> torch.Tensor:
        """Chunk i as a chunk-length tensor: a view when possible, else a padded copy."""
        lo, hi = self.bounds(i)
        if self.residual is None and self.full(i):
            return self.flat[lo:hi]
        buf = torch.zeros(self.length, dtype=self.flat.dtype, device=self.flat.device)
        buf[: hi - lo] = self.flat[lo:hi]
        if self.residual is not None:
            buf[: hi - lo] += self.residual[lo:hi]
        return buf

    def load_all(self) -> torch.Tensor:
        """The n chunks end to end (n * length values): the segment itself when it fills
        them and has no residual, else one padded copy (plus the residual), a segment of
        scratch (comm_scratch counts one of input plus residual)."""
        numel, total = self.flat.numel(), self.n * self.length
        if self.residual is None and numel == total:
            return self.flat
        buf = torch.zeros(total, dtype=self.flat.dtype, device=self.flat.device)
        buf[:numel] = self.flat
        if self.residual is not None:
            buf[:numel] += self.residual
        return buf

    def store_rows(self, codec: ChunkCodec, payloads: list[torch.Tensor]) -> bool:
        """Decode the n chunks' payloads into the segment with one codec call, when they lie
        end to end and the codec decodes them as one (ChunkCodec.rows); False otherwise."""
        whole = joined(payloads)
        if whole is None or len(payloads) != self.n or not codec.rows(self.n):
            return False
        numel, total = self.flat.numel(), self.n * self.length
        if numel == total:
            codec.decode_rows(whole, self.flat)
        else:  # the last chunk is padded: through a segment of scratch
            scratch = torch.empty(total, dtype=self.flat.dtype, device=self.flat.device)
            self.flat.copy_(codec.decode_rows(whole, scratch)[:numel])
        return True

    def store(self, i: int, decode: Callable[[torch.Tensor], torch.Tensor],
              scratch: torch.Tensor) -> None:
        """Write chunk i from a decoder (straight into place when the chunk is full)."""
        lo, hi = self.bounds(i)
        if self.full(i):
            decode(self.flat[lo:hi])
        elif hi > lo:
            self.flat[lo:hi] = decode(scratch)[: hi - lo]


def all_finite(t: torch.Tensor) -> torch.Tensor:
    """Whether t holds no NaN/Inf, as a device scalar (no sync), from its min and max
    (which NaN and Inf reach): no temporary of t's size, as isfinite's would be."""
    lo, hi = torch.aminmax(t)
    return torch.isfinite(lo) & torch.isfinite(hi)


def settle_residual(chunks: Chunks, codec: ChunkCodec, sent: list[torch.Tensor],
                    results: list[torch.Tensor], scratch: torch.Tensor, cost: Cost,
                    finite: torch.Tensor | None = None) -> None:
    """Error feedback once the sums are known: residual_i = (x_i + residual_i) minus what
    payload i carried, unless any result holds NaN/Inf. An fp16 overflow on any rank reaches
    every rank's result (payloads mark non-finite values), the loss scaler skips that step,
    and so the residual stays as it was, finite. The check is a device scalar: no sync.
    `finite`: that check made already by the caller (results are then not decoded)."""
    device = scratch.device
    with Timed(cost, "decompress_s", device):
        if _settle_rows(chunks, codec, sent, results, finite):
            return
        if finite is None:
            finite = torch.ones((), dtype=torch.bool, device=device)
            for payload in results:
                finite &= all_finite(codec.decode(payload, scratch))
        for i, payload in enumerate(sent):
            lo, hi = chunks.bounds(i)
            if hi == lo:
                continue
            meant = chunks.load(i)  # a fresh buffer: x_i + residual_i
            meant -= codec.decode(payload, scratch)
            old = chunks.residual[lo:hi]
            torch.where(finite, meant[: hi - lo], old, out=old)  # in place: no third copy


def _settle_rows(chunks: Chunks, codec: ChunkCodec, sent: list[torch.Tensor],
                 results: list[torch.Tensor], finite: torch.Tensor | None) -> bool:
    """settle_residual with one decode call for all n sent payloads (and one for the
    results), when they lie end to end and the codec decodes them as one (ChunkCodec.rows);
    two segments of scratch. False: not possible, nothing done."""
    whole = joined(sent)
    if whole is None or len(sent) != chunks.n or not codec.rows(chunks.n):
        return False
    flat = chunks.flat
    scratch = torch.empty(chunks.n * chunks.length, dtype=flat.dtype, device=flat.device)
    if finite is None:
        finite = torch.ones((), dtype=torch.bool, device=flat.device)
        got = joined(results)
        if got is not None and len(results) == chunks.n:
            finite &= all_finite(codec.decode_rows(got, scratch))
        else:
            for payload in results:
                finite &= all_finite(codec.decode(payload, scratch[: chunks.length]))
    meant = chunks.load_all()  # a fresh buffer (a residual is set): x + residual
    meant -= codec.decode_rows(whole, scratch)
    del scratch
    old = chunks.residual
    torch.where(finite, meant[: flat.numel()], old, out=old)  # in place: no third copy
    return True
