"""How much extra memory a compressed collective may hold (torch-free: the layout's
memory estimate imports it)."""

from __future__ import annotations

SEGMENT_BYTES = 64 << 20  # raw bytes per segment of a large message


def scratch_bytes(message_bytes: int, ratio: float = 1.0,
                  segment_bytes: int = SEGMENT_BYTES) -> int:
    """Bound of the extra memory one compressed all-reduce holds (the layout's estimate
    counts it): per segment, the outgoing and incoming payloads (raw size / ratio each;
    ratio 1 covers passthrough) plus at most one segment of chunk scratch and fp32
    accumulator."""
    seg = min(message_bytes, segment_bytes)
    return int(2 * seg / ratio + seg) + (1 << 16)
