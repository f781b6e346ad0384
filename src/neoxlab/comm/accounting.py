"""Per-dimension, per-op counters of every wrapped call: bytes, time, calls.

bytes_in is the logical message (the tensor the engine passed); bytes_out is what this rank
actually put on the wire for it (compressed payloads including headers and padding), scaled
to the same message, so bytes_in / bytes_out is the achieved compression ratio.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass
class OpStats:
    calls: int = 0
    compressed_calls: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    compress_s: float = 0.0
    decompress_s: float = 0.0
    comm_s: float = 0.0
    group_size: int = 0
    compressor: str = "none"
    via_deepspeed: int = 0  # calls that entered through deepspeed.comm
    # compression.backend=mpi: what the MPI library does to these bytes after we hand them
    # over (bytes_out is then what we handed over; the library's wire bytes are not seen)
    library: str | None = None


BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_gather_into_tensor": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "reduce_scatter_tensor": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}


def bus_bandwidth_gbps(op: str, nbytes: int, seconds: float, group_size: int) -> float | None:
    """nccl-tests bus bandwidth with the group's own size (not the world size)."""
    if seconds <= 0 or group_size < 1:
        return None
    factor = BUS_FACTORS.get(op, lambda n: 1.0)(group_size)
    return nbytes / seconds * factor / 1e9


# host-timed phases kept per rank (Accountant.timeline): a few hundred steps of a small run
TIMELINE_SPANS = 20_000
# timed calls whose CUDA events may wait unresolved; past this, the oldest is waited for (it
# finished long ago: thousands of collectives were queued after it)
MAX_PENDING = 1024


class Accountant:
    def __init__(self) -> None:
        self.stats: dict[tuple[str, str], OpStats] = defaultdict(OpStats)
        # costs timed by CUDA events, oldest first: folded in as their events complete
        # (a query, no wait), so at most MAX_PENDING of them are held at any time
        self.pending: deque[tuple[tuple[str, str], object, int]] = deque()
        # (ranks of the group, op) -> [calls, bytes_out]: which ranks the bytes went between,
        # so the traffic between nodes can be told from the traffic inside one
        self.groups: dict[tuple[tuple[int, ...], str], list[int]] = defaultdict(lambda: [0, 0])
        # (dim, op, phase, wall-clock start, seconds) of host-timed phases, the first
        # TIMELINE_SPANS: when ranks sharing cores encode, decode and wait on the wire
        self.timeline: list[tuple[str, str, str, float, float]] = []

    def record(
        self, dim: str, op: str, *, bytes_in: int, bytes_out: int, comm_s: float,
        group_size: int, compressor: str = "none", compress_s: float = 0.0,
        decompress_s: float = 0.0, via_deepspeed: bool = False, pending=None,
        weight: int = 1, ranks: tuple[int, ...] | None = None, library: str | None = None,
        spans: Sequence[tuple[str, float, float]] = (),
    ) -> None:
        """One call. `pending`: its Cost when it holds unresolved CUDA events (their times,
        times `weight` for sampled calls, are added once they complete); `spans`: its
        host-timed phases (Cost.spans)."""
        room = TIMELINE_SPANS - len(self.timeline)
        self.timeline += [(dim, op, phase, start, took)
                          for phase, start, took in spans[:max(room, 0)]]
        if ranks is not None:
            tally = self.groups[(ranks, op)]
            tally[0] += 1
            tally[1] += bytes_out
        s = self.stats[(dim, op)]
        if pending is not None and pending.events:
            self.pending.append(((dim, op), pending, weight))
            self.fold_completed()
        s.calls += 1
        s.compressed_calls += compressor != "none"
        s.bytes_in += bytes_in
        s.bytes_out += bytes_out
        s.comm_s += comm_s
        s.compress_s += compress_s
        s.decompress_s += decompress_s
        s.group_size = max(s.group_size, group_size)
        s.via_deepspeed += via_deepspeed
        if compressor != "none":
            s.compressor = compressor
        if library is not None:
            s.library = library

    def fold_completed(self) -> None:
        """Fold in the oldest timed calls whose events have completed (queried, not waited
        for), and wait for the oldest beyond MAX_PENDING: pending stays bounded however
        long the run."""
        while self.pending and (len(self.pending) > MAX_PENDING or self.pending[0][1].ready()):
            self._fold(self.pending.popleft())

    def resolve(self) -> None:
        """Wait for every recorded CUDA event and add its time (report time)."""
        while self.pending:
            self._fold(self.pending.popleft())

    def _fold(self, entry) -> None:
        key, cost, weight = entry
        before = (cost.comm_s, cost.compress_s, cost.decompress_s)
        cost.resolve()
        s = self.stats[key]
        s.comm_s += (cost.comm_s - before[0]) * weight
        s.compress_s += (cost.compress_s - before[1]) * weight
        s.decompress_s += (cost.decompress_s - before[2]) * weight

    def rows(self, rank: int) -> list[dict]:
        self.resolve()
        out = []
        for (dim, op), s in sorted(self.stats.items()):
            row = {"rank": rank, "dim": dim, "op": op, **asdict(s)}
            row["busbw_GBps"] = bus_bandwidth_gbps(op, s.bytes_in, s.comm_s, s.group_size)
            out.append(row)
        return out

    def timeline_rows(self, rank: int) -> list[dict]:
        return [{"rank": rank, "dim": dim, "op": op, "phase": phase, "start": start, "s": took}
                for dim, op, phase, start, took in self.timeline]

    def group_rows(self, rank: int) -> list[dict]:
        return [{"rank": rank, "ranks": list(ranks), "op": op, "calls": calls,
                 "bytes_out": nbytes}
                for (ranks, op), (calls, nbytes) in sorted(self.groups.items())]


def totals_by_dim(rows: list[dict]) -> dict[str, dict]:
    """Sum rows of all ranks per dimension (for summary.json and the final table)."""
    keys = ("calls", "compressed_calls", "bytes_in", "bytes_out", "compress_s",
            "decompress_s", "comm_s")
    totals: dict[str, dict] = {}
    for row in rows:
        t = totals.setdefault(row["dim"], {k: 0 for k in keys})
        for k in keys:
            t[k] += row[k]
        if row.get("library"):
            t["library"] = row["library"]  # "compressed by the MPI library (...)"
    for t in totals.values():
        t["ratio"] = t["bytes_in"] / t["bytes_out"] if t["bytes_out"] else None
    return totals
