"""How much extra memory a compressed collective may hold: pure arithmetic at the bottom
layer, shared by the compressed collectives and the layout's memory estimate.

A compressed all-reduce works segment by segment. A segment is a quarter of the message,
at least MIN_SEGMENT_BYTES (tiny messages go whole) and at most SEGMENT_BYTES, so the extra
memory stays a bounded fraction of any message above a few MiB.
"""

from __future__ import annotations

SEGMENT_BYTES = 64 << 20  # largest segment of a message
MIN_SEGMENT_BYTES = 1 << 20  # below this, splitting only adds collective calls
# A codec's own temporaries while it codes one segment (or a chunk of one): the codecs that
# work in slices (ZFP's torch ops, int8/int4's, mpc's) size them to stay under this budget,
# and besides it a codec may hold CODEC_COPIES fp32-sized copies of what it codes (mpc's
# staged planes, topk's magnitudes and torch.topk's own work, an upcast).
CODEC_SCRATCH_BYTES = 128 << 20
CODEC_COPIES = 3


def segment_bytes_for(message_bytes: int, cap: int = SEGMENT_BYTES) -> int:
    """Raw bytes per segment of a message (the cap, e.g. a test's, wins)."""
    return min(cap, max(message_bytes // 4, MIN_SEGMENT_BYTES))


def scratch_bytes(message_bytes: int, ratio: float = 1.0, cap: int = SEGMENT_BYTES) -> int:
    """Bound of the extra memory one compressed all-reduce holds (the layout's estimate
    counts it), for one segment: the worst case is the all-gather algorithm of a two-rank
    group with error feedback, which holds its payload, the two gathered payloads (raw size
    / ratio each; ratio 1 covers passthrough), one segment of decode scratch and one of
    input plus residual: 3 seg / ratio + 2 seg, i.e. 1.25x of a message of 4+ MiB."""
    seg = min(message_bytes, segment_bytes_for(message_bytes, cap))
    return int(3 * seg / ratio + 2 * seg) + (1 << 16)


def codec_scratch_bytes(segment_bytes: int, itemsize: int = 4) -> int:
    """Bound of a codec's own temporaries while it codes (part of) one segment of
    itemsize-byte values: the slice budget plus CODEC_COPIES fp32 copies of the segment."""
    return CODEC_SCRATCH_BYTES + CODEC_COPIES * segment_bytes * 4 // max(itemsize, 1)


def op_scratch_bytes(op: str, message_bytes: int, n: int, itemsize: int = 4,
                     cap: int = SEGMENT_BYTES) -> int:
    """Bound of the extra memory one compressed call of `op` holds over a group of n, for a
    contiguous message of message_bytes (an all-gather's: one rank's part; a reduce-
    scatter's: the whole input) of itemsize-byte values and contiguous outputs, payloads
    taken at the raw size (passthrough, the worst case), plus the codec's own temporaries
    (codec_scratch_bytes). Every op goes in segments (segment_bytes_for); at its peak one
    holds, besides the codec's temporaries:

    - all_reduce: see scratch_bytes;
    - reduce (to an owner): its payload, the owner's n received payloads, a segment of
      decode scratch, of error-feedback input and of fp32 sum;
    - all_gather: its payload and the n gathered ones;
    - reduce_scatter: the n chunk payloads sent and the n received (a segment each), a
      chunk slice of decode scratch and one of fp32 sum;
    - broadcast, send, recv: one payload.
    """
    seg = min(message_bytes, segment_bytes_for(message_bytes, cap))
    return collective_scratch_bytes(op, message_bytes, n, itemsize, cap) + codec_scratch_bytes(
        seg, itemsize)


def collective_scratch_bytes(op: str, message_bytes: int, n: int, itemsize: int = 4,
                             cap: int = SEGMENT_BYTES) -> int:
    """op_scratch_bytes without the codec's temporaries: the collective's own buffers (all
    a call holds with a codec that writes straight into them, as none and fp16 do)."""
    seg = min(message_bytes, segment_bytes_for(message_bytes, cap))
    fp32 = 2 if itemsize <= 2 else 1  # an fp32 sum of 16-bit values takes twice their bytes
    slack = 1 << 16
    if op == "all_reduce":
        return scratch_bytes(message_bytes, cap=cap)
    if op == "reduce":
        return (n + 1) * seg + (2 + fp32) * seg + slack
    if op == "all_gather":
        return (n + 1) * seg + slack
    if op == "reduce_scatter":
        return 2 * seg + (1 + fp32) * -(-seg // max(n, 1)) + slack
    if op in ("broadcast", "send", "recv"):
        return seg + slack
    raise ValueError(f"op={op!r} is not a compressed collective: one of all_reduce, reduce, "
                     "all_gather, reduce_scatter, broadcast, send, recv")
