"""CUDA-timed calls stay bounded in the accounting over any number of steps: their events are
folded in as they complete, and past MAX_PENDING the oldest is waited for.

torch.cuda.Event is replaced by a stand-in with query/synchronize/elapsed_time over a fake
device that runs `lag` events behind the host, so the real Timed and Accountant run on CPU.
"""

from __future__ import annotations

import pytest
import torch

from neoxlab.comm import accounting, collectives
from neoxlab.comm.accounting import Accountant

CUDA = torch.device("cuda")


class FakeDevice:
    """Events complete in the order recorded, `lag` records behind the newest (a GPU
    running behind the host); lag=None: nothing completes until waited for."""

    def __init__(self, lag: int | None):
        self.lag, self.recorded, self.done = lag, 0, 0
        self.waits = 0  # synchronize() calls that had to wait

    def record(self) -> int:
        self.recorded += 1
        if self.lag is not None:
            self.done = max(self.done, self.recorded - self.lag)
        return self.recorded


def fake_event_class(device: FakeDevice):
    class FakeEvent:
        def __init__(self, enable_timing: bool = False):
            self.seq = None

        def record(self, stream=None) -> None:
            self.seq = device.record()

        def query(self) -> bool:
            return self.seq is not None and self.seq <= device.done

        def synchronize(self) -> None:
            if not self.query():
                device.waits += 1
                device.done = self.seq

        def elapsed_time(self, end) -> float:
            assert self.query() and end.query(), "elapsed_time of an event not completed"
            return float(end.seq - self.seq)  # ms: one per event recorded in between

    return FakeEvent


def run_steps(monkeypatch, device: FakeDevice, steps: int, calls_per_step: int):
    """Timed CUDA blocks recorded like the patch's sampled calls; returns the accountant,
    the largest pending length seen, and the milliseconds the blocks took."""
    monkeypatch.setattr(torch.cuda, "Event", fake_event_class(device))
    acc, largest, total_ms = Accountant(), 0, 0.0
    for _ in range(steps):
        for _ in range(calls_per_step):
            cost = collectives.Cost()
            with collectives.Timed(cost, "comm_s", CUDA):
                device.record()  # the collective's own work, between start and end
            total_ms += 2.0  # start -> work -> end
            acc.record("tp", "all_reduce", bytes_in=8, bytes_out=8, comm_s=0.0, group_size=2,
                       pending=cost)
            largest = max(largest, len(acc.pending))
    return acc, largest, total_ms


def test_pending_events_stay_bounded_over_many_steps(monkeypatch):
    device = FakeDevice(lag=30)
    acc, largest, total_ms = run_steps(monkeypatch, device, steps=200, calls_per_step=100)
    assert largest <= 30  # only what the device has not finished yet
    assert device.waits == 0  # completed events are queried, never waited for
    acc.resolve()
    assert acc.stats[("tp", "all_reduce")].comm_s == pytest.approx(total_ms / 1e3)
    assert acc.stats[("tp", "all_reduce")].calls == 20_000


def test_a_stalled_device_caps_pending_at_the_limit(monkeypatch):
    device = FakeDevice(lag=None)
    acc, largest, total_ms = run_steps(monkeypatch, device, steps=30, calls_per_step=100)
    assert largest == accounting.MAX_PENDING  # then the oldest is waited for
    assert device.waits == 30 * 100 - accounting.MAX_PENDING
    rows = acc.rows(0)  # report time: everything folded in
    assert not acc.pending
    assert rows[0]["comm_s"] == pytest.approx(total_ms / 1e3)
