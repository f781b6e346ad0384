"""Run compressed collectives of CUDA tensors on a side stream, ordered by CUDA events.

A compressed collective is a chain of codec kernels and raw collectives. Queued on the
caller's stream it would serialise with the caller's compute; on a side stream it can overlap
it. Ordering is kept with events only, never a host sync: the side stream first waits for
the caller's stream (the inputs are ready), and the caller's stream waits for the side
stream's "done" event, at once for a synchronous call and at `wait()` for `async_op=True`
(as an NCCL Work's wait() does). Tensors the caller owns are marked as used by the side
stream, so the caching allocator does not hand their memory out again before it finished.
Host tensors have no streams: the collective runs in place and an async caller gets a
finished Work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


class CompletedWork(dist.Work):
    """The handle of an async collective that already ran to completion."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True


class StreamWork(dist.Work):
    """The handle of a collective queued on a side stream: wait() makes the stream current
    at wait time wait for it on the device, without blocking the host."""

    def __init__(self, done: torch.cuda.Event, device: torch.device):
        super().__init__()
        self.done, self.device = done, device

    def wait(self, timeout=None) -> bool:
        torch.cuda.current_stream(self.device).wait_event(self.done)
        return True

    def is_completed(self) -> bool:
        return self.done.query()

    def is_success(self) -> bool:
        return self.done.query()

    def synchronize(self) -> None:
        self.done.synchronize()


class SideStreams:
    """One side stream per CUDA device, made at first use."""

    def __init__(self) -> None:
        self.streams: dict[torch.device, torch.cuda.Stream] = {}

    def run(self, device: torch.device, body: Callable[[], T], tensors: Iterable[torch.Tensor],
            async_op: bool) -> tuple[T, dist.Work | None]:
        """body() on the device's side stream; `tensors`: the caller's tensors it reads or
        writes. Returns body's result and, for async_op, the Work to wait on."""
        if device.type != "cuda":
            return body(), (CompletedWork() if async_op else None)
        side = self.streams.get(device)
        if side is None:
            side = self.streams[device] = torch.cuda.Stream(device)
        caller = torch.cuda.current_stream(device)
        side.wait_stream(caller)
        with torch.cuda.stream(side):
            result = body()
        for tensor in tensors:
            if tensor.device == device:
                tensor.record_stream(side)
        done = torch.cuda.Event()
        done.record(side)
        if async_op:
            return result, StreamWork(done, device)
        caller.wait_event(done)
        return result, None


def caller_tensors(arguments: dict) -> list[torch.Tensor]:
    """Every tensor among a collective's arguments (lists of tensors included)."""
    found = []
    for value in arguments.values():
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, list | tuple):
            found += [v for v in value if isinstance(v, torch.Tensor)]
    return found
