"""How much extra memory a compressed collective may hold: pure arithmetic at the bottom
layer, shared by the compressed collectives and the layout's memory estimate.

A compressed all-reduce works segment by segment. A segment is a quarter of the message,
at least MIN_SEGMENT_BYTES (tiny messages go whole) and at most SEGMENT_BYTES, so the extra
memory stays a bounded fraction of any message above a few MiB.
"""

from __future__ import annotations

SEGMENT_BYTES = 64 << 20  # largest segment of a message
MIN_SEGMENT_BYTES = 1 << 20  # below this, splitting only adds collective calls


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
