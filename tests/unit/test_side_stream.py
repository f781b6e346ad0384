"""Compressed collectives on a side stream: host tensors run in place; CUDA tensors are
ordered against the caller's stream by events (the CUDA tests run on a lent GPU)."""

from __future__ import annotations

import pytest
import torch

from neoxlab.comm.side_stream import CompletedWork, SideStreams, StreamWork, caller_tensors

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
SPIN = 50_000_000  # GPU cycles (~25-50 ms): a window in which a missing wait shows as a race


def test_host_tensors_run_in_place_and_async_callers_get_a_finished_work():
    streams = SideStreams()
    x = torch.ones(4)
    calls = []

    def body():
        calls.append(1)
        x.mul_(3)
        return "cost"

    assert streams.run(x.device, body, [x], async_op=False) == ("cost", None)
    result, work = streams.run(x.device, body, [x], async_op=True)
    assert result == "cost" and isinstance(work, CompletedWork) and work.wait()
    assert work.is_completed() and len(calls) == 2 and torch.equal(x, torch.full((4,), 9.0))
    assert streams.streams == {}  # no stream was made for the host


def test_caller_tensors_finds_tensors_in_lists():
    a, b, c = torch.zeros(1), torch.zeros(2), torch.zeros(3)
    found = caller_tensors({"tensor_list": [a, b], "tensor": c, "group": None, "async_op": True})
    assert [t.numel() for t in found] == [1, 2, 3]


@CUDA
def test_side_stream_waits_for_the_callers_writes_and_the_caller_for_its_result():
    dev = torch.device("cuda", 0)
    streams = SideStreams()
    x = torch.zeros(1 << 20, device=dev)
    y = torch.empty_like(x)
    torch.cuda._sleep(SPIN)  # the caller's stream is busy ...
    x.fill_(2.0)  # ... then writes the input
    streams.run(dev, lambda: y.copy_(x * 3), [x, y], async_op=False)
    assert torch.cuda.current_stream(dev) != streams.streams[dev]
    assert torch.equal(y.sum(), torch.tensor(6.0 * x.numel(), device=dev))


@CUDA
def test_async_work_orders_the_caller_at_wait_without_a_host_sync():
    dev = torch.device("cuda", 0)
    streams = SideStreams()
    x = torch.full((1 << 20,), 1.0, device=dev)

    def body():
        torch.cuda._sleep(SPIN)
        x.add_(1.0)

    _, work = streams.run(dev, body, [x], async_op=True)
    assert isinstance(work, StreamWork)
    work.wait()  # the caller's stream now waits on the device; the host goes on
    assert float(x.sum()) == 2.0 * x.numel()
    assert work.is_completed()
