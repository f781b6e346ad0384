"""How the ranks' phases line up: while one rank encodes or decodes, how many ranks are busy
on the cores (not waiting in a collective) and how many are in a codec too.

Read from the host-timed spans each rank keeps (Accountant.timeline, written to
logs/timeline.rank<N>.jsonl). The performance model must guess whether ranks that share
cores encode at once (each codec slowed by all of them) or in turn while the wire carries
another rank's segment (perfmodel.predict.codec_on_path); this measures it in a run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

CODEC_PHASES = ("compress_s", "decompress_s")
WIRE_PHASE = "comm_s"


@dataclass(frozen=True)
class Span:
    rank: int
    dim: str
    phase: str
    start: float
    end: float


@dataclass(frozen=True)
class CodecOverlap:
    """One dimension's codec spans over all ranks, in a window of steps."""

    dim: str
    codec_s_per_rank: float  # summed over the window, averaged over ranks
    calls_per_rank: float
    busy_ranks: float  # mean number of ranks not waiting on the wire, codec time weighted
    codec_ranks: float  # mean number of ranks in a codec (itself included)


def load(run_dir: Path) -> list[Span]:
    spans = []
    for path in sorted((run_dir / "logs").glob("timeline.rank*.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            spans.append(Span(r["rank"], r["dim"], r["phase"], r["start"], r["start"] + r["s"]))
    return spans


def step_window(run_dir: Path, last: int) -> tuple[float, float]:
    """Wall-clock start and end of the run's last `last` steps (metrics.jsonl, rank 0)."""
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "iteration_s" in s and "time" in s][-last:]
    if not steps:
        raise ValueError(f"{run_dir}/metrics.jsonl has no timed steps")
    return steps[0]["time"] - steps[0]["iteration_s"], steps[-1]["time"]


def _covered(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] inside the union of `intervals` (sorted, non-overlapping)."""
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in intervals)


def _union(spans: list[Span]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for s in sorted(spans, key=lambda s: s.start):
        if merged and s.start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], s.end)
        else:
            merged.append([s.start, s.end])
    return [(a, b) for a, b in merged]


def codec_overlap(spans: list[Span], window: tuple[float, float]) -> list[CodecOverlap]:
    """Per dimension: for every codec span that starts in `window`, the mean number of ranks
    busy on the cores (every rank but those inside a wire phase) and in a codec over it."""
    lo, hi = window
    ranks = sorted({s.rank for s in spans})
    wire = {r: _union([s for s in spans if s.rank == r and s.phase == WIRE_PHASE])
            for r in ranks}
    codec = {r: _union([s for s in spans if s.rank == r and s.phase in CODEC_PHASES])
             for r in ranks}
    out = []
    for dim in sorted({s.dim for s in spans if s.phase in CODEC_PHASES}):
        mine = [s for s in spans
                if s.dim == dim and s.phase in CODEC_PHASES and lo <= s.start < hi]
        total = sum(s.end - s.start for s in mine)
        if total <= 0:
            continue
        busy = in_codec = 0.0
        for s in mine:
            for r in ranks:
                if r == s.rank:
                    busy += s.end - s.start
                    in_codec += s.end - s.start
                    continue
                busy += (s.end - s.start) - _covered(wire[r], s.start, s.end)
                in_codec += _covered(codec[r], s.start, s.end)
        out.append(CodecOverlap(dim, total / len(ranks), len(mine) / len(ranks),
                                busy / total, in_codec / total))
    return out
