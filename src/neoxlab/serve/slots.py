"""Slot bookkeeping for temporal fusion: which request owns which preallocated slot.

Pure Python (no tensors), so the reordering rule can be property-tested in isolation. With
reordering on, the live requests always occupy one contiguous slot range, so the fused
decode step never computes a finished request's row; with it off, holes left by finished
requests stay inside the range and are computed as wasted rows until refilled.
"""

from __future__ import annotations

Move = tuple[int, int]  # (source slot, destination slot)


class SlotTable:
    """Owners of `num_slots` slots; `release` returns the buffer moves reordering needs."""

    def __init__(self, num_slots: int, reorder: bool):
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots} must be >= 1")
        self.num_slots = num_slots
        self.reorder = reorder
        self.owner: list[int | None] = [None] * num_slots

    def live(self) -> list[int]:
        return [s for s, o in enumerate(self.owner) if o is not None]

    def span(self) -> tuple[int, int]:
        """[lo, hi) covering every live slot; (0, 0) when none is live."""
        live = self.live()
        return (live[0], live[-1] + 1) if live else (0, 0)

    def free(self) -> int:
        return self.owner.count(None)

    def assign(self, request_id: int) -> int:
        """A free slot for a new request: next to the range (reorder) or the lowest hole."""
        if self.free() == 0:
            raise RuntimeError("no free slot: the scheduler must keep the request waiting")
        lo, hi = self.span()
        if self.reorder and hi > lo:
            slot = hi if hi < self.num_slots else lo - 1
        else:
            slot = self.owner.index(None)
        self.owner[slot] = request_id
        return slot

    def release(self, slot: int) -> list[Move]:
        """Free `slot`; with reordering, move outlying requests so the range is contiguous."""
        if self.owner[slot] is None:
            raise ValueError(f"slot {slot} is not live")
        self.owner[slot] = None
        if not self.reorder:
            return []
        moves = plan_reorder(self.live())
        for src, dst in moves:
            self.owner[dst], self.owner[src] = self.owner[src], None
        return moves


def plan_reorder(live: list[int]) -> list[Move]:
    """Moves that make the sorted `live` slots contiguous with the fewest copies.

    The destination window (width k = number of live slots) is the one that already holds
    the most live slots (the lowest such window on ties); each live slot outside it is copied
    into a free slot inside it. A finish at either end leaves the rest contiguous: no moves.
    """
    k = len(live)
    if k == 0 or live[-1] - live[0] + 1 == k:
        return []
    occupied = set(live)
    best_start, best_count = live[0], -1
    for start in range(live[0], live[-1] - k + 2):
        count = sum(1 for s in range(start, start + k) if s in occupied)
        if count > best_count:
            best_start, best_count = start, count
    window = range(best_start, best_start + k)
    outliers = [s for s in live if s not in window]
    holes = [s for s in window if s not in occupied]
    return list(zip(outliers, holes, strict=True))
