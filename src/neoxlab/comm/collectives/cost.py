"""What one compressed collective cost: bytes on the wire and seconds per phase (codec,
wire), timed by the host clock on CPU and by CUDA events (no sync) on a GPU."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


@dataclass
class Cost:
    bytes_out: int = 0
    compress_s: float = 0.0
    decompress_s: float = 0.0
    comm_s: float = 0.0
    events: list = field(default_factory=list)  # (attr, start, end) CUDA events, unresolved
    spans: list = field(default_factory=list)  # (attr, wall-clock start, seconds): host-timed

    def ready(self) -> bool:
        """Whether every timed block's end event has completed (a query: never waits)."""
        return all(end.query() for _, _, end in self.events)

    def resolve(self) -> Cost:
        """Fold the CUDA event pairs into the seconds (waits for those not yet done)."""
        for attr, start, end in self.events:
            end.synchronize()
            setattr(self, attr, getattr(self, attr) + start.elapsed_time(end) / 1e3)
        self.events.clear()
        return self


class Timed:
    """Adds the duration of its block to cost.<attr>: host clock for CPU work, CUDA events
    (no synchronization) for work queued on a GPU. Host-timed blocks also keep their
    wall-clock start (cost.spans), so the ranks' codec and wire phases can be lined up
    across processes (studies/codec_overlap.py)."""

    def __init__(self, cost: Cost, attr: str, device: torch.device):
        self.cost, self.attr, self.cuda = cost, attr, device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.wall = time.time()
            self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.cost.events.append((self.attr, self.start, end))
        else:
            took = time.perf_counter() - self.t0
            setattr(self.cost, self.attr, getattr(self.cost, self.attr) + took)
            self.cost.spans.append((self.attr, self.wall, took))
