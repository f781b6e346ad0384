"""Compressed collectives over torch.distributed (any backend: gloo, NCCL, MPI).

Each function takes the *original* torch.distributed functions (`raw`) so it never re-enters
the patch, exchanges payload sizes first (compressed sizes vary: NaN/Inf passthrough, mpc),
and returns the cost of the call for accounting. Reductions sum in rank order, so every
rank of a group computes the identical result.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from neoxlab.compress import Compressor


@dataclass
class Cost:
    bytes_out: int = 0
    compress_s: float = 0.0
    decompress_s: float = 0.0
    comm_s: float = 0.0


class _Timed:
    def __init__(self, cost: Cost, attr: str):
        self.cost, self.attr = cost, attr

    def __enter__(self):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        setattr(self.cost, self.attr, getattr(self.cost, self.attr) + time.perf_counter()
                - self.start)


def _encode(c: Compressor, x: torch.Tensor, cost: Cost) -> torch.Tensor:
    with _Timed(cost, "compress_s"):
        return c.encode(x)


def _decode(c: Compressor, buf: torch.Tensor, cost: Cost) -> torch.Tensor:
    with _Timed(cost, "decompress_s"):
        return c.decode(buf)


def _sizes(raw: SimpleNamespace, nbytes: int, group, n: int, cost: Cost) -> list[int]:
    mine = torch.tensor([nbytes], dtype=torch.int64)
    out = torch.empty(n, dtype=torch.int64)
    with _Timed(cost, "comm_s"):
        raw.all_gather_into_tensor(out, mine, group=group)
    return out.tolist()


def gather_payloads(raw, buf: torch.Tensor, group, n: int, cost: Cost) -> list[torch.Tensor]:
    """All-gather variable-length byte payloads (padded to the largest one)."""
    sizes = _sizes(raw, buf.numel(), group, n, cost)
    width = max(sizes)
    padded = torch.zeros(width, dtype=torch.uint8, device=buf.device)
    padded[: buf.numel()] = buf
    out = torch.empty(n * width, dtype=torch.uint8, device=buf.device)
    with _Timed(cost, "comm_s"):
        raw.all_gather_into_tensor(out, padded, group=group)
    cost.bytes_out += width
    return [out[i * width : i * width + s] for i, s in enumerate(sizes)]


def exchange_payloads(raw, bufs: list[torch.Tensor], group, cost: Cost) -> list[torch.Tensor]:
    """All-to-all of one variable-length payload per peer (sizes exchanged first)."""
    n = len(bufs)
    send_sizes = torch.tensor([b.numel() for b in bufs], dtype=torch.int64)
    recv_sizes = torch.empty(n, dtype=torch.int64)
    with _Timed(cost, "comm_s"):
        raw.all_to_all_single(recv_sizes, send_sizes, group=group)
    recv = recv_sizes.tolist()
    out = torch.empty(sum(recv), dtype=torch.uint8, device=bufs[0].device)
    with _Timed(cost, "comm_s"):
        raw.all_to_all_single(out, torch.cat(bufs), recv, send_sizes.tolist(), group=group)
    cost.bytes_out += sum(b.numel() for b in bufs)
    return list(out.split(recv))


def _sum(tensors: list[torch.Tensor]) -> torch.Tensor:
    total = tensors[0].clone()
    for t in tensors[1:]:
        total += t
    return total


def all_reduce_allgather(raw, c: Compressor, x: torch.Tensor, group, n: int,
                         residual: torch.Tensor | None = None) -> tuple[torch.Tensor, Cost]:
    """Every rank gathers every compressed tensor and sums them: one round, n x memory."""
    cost = Cost()
    buf = _encode(c, x, cost)
    if residual is not None:
        residual.copy_(x - _decode(c, buf, cost))
    parts = [_decode(c, b, cost) for b in gather_payloads(raw, buf, group, n, cost)]
    return _sum(parts), cost


def all_reduce_alltoall(raw, c: Compressor, x: torch.Tensor, group, n: int,
                        residual: torch.Tensor | None = None) -> tuple[torch.Tensor, Cost]:
    """Compressed reduce-scatter (all-to-all of chunks), local sum, compressed all-gather."""
    cost = Cost()
    flat = x.reshape(-1)
    chunk = -(-flat.numel() // n)
    padded = torch.zeros(chunk * n, dtype=x.dtype, device=x.device)
    padded[: flat.numel()] = flat
    pieces = list(padded.split(chunk))
    bufs = [_encode(c, p, cost) for p in pieces]
    if residual is not None:
        sent = torch.cat([_decode(c, b, cost) for b in bufs])[: flat.numel()]
        residual.copy_((flat - sent).view_as(x))
    received = exchange_payloads(raw, bufs, group, cost)
    reduced = _sum([_decode(c, b, cost) for b in received])
    first_phase = cost.bytes_out
    gathered = gather_payloads(raw, _encode(c, reduced, cost), group, n, cost)
    full = torch.cat([_decode(c, b, cost) for b in gathered])[: flat.numel()]
    cost.bytes_out = (first_phase + (cost.bytes_out - first_phase) * n) // 2
    return full.view_as(x), cost


def all_gather_tensor(raw, c: Compressor, x: torch.Tensor, group, n: int
                      ) -> tuple[list[torch.Tensor], Cost]:
    cost = Cost()
    payloads = gather_payloads(raw, _encode(c, x, cost), group, n, cost)
    return [_decode(c, b, cost) for b in payloads], cost


def reduce_scatter(raw, c: Compressor, x: torch.Tensor, group, n: int
                   ) -> tuple[torch.Tensor, Cost]:
    """x holds n equal chunks; rank i gets the sum of everyone's chunk i."""
    cost = Cost()
    bufs = [_encode(c, p, cost) for p in x.reshape(n, -1)]
    received = exchange_payloads(raw, bufs, group, cost)
    return _sum([_decode(c, b, cost) for b in received]), cost


def broadcast(raw, c: Compressor, x: torch.Tensor, src: int, me: int, group
              ) -> tuple[torch.Tensor, Cost]:
    cost = Cost()
    buf = _encode(c, x, cost) if me == src else None
    size = torch.tensor([buf.numel() if buf is not None else 0], dtype=torch.int64)
    with _Timed(cost, "comm_s"):
        raw.broadcast(size, src, group=group)
    if buf is None:
        buf = torch.empty(int(size), dtype=torch.uint8, device=x.device)
    with _Timed(cost, "comm_s"):
        raw.broadcast(buf, src, group=group)
    cost.bytes_out = buf.numel()
    return (x if me == src else _decode(c, buf, cost)), cost


def send(raw, c: Compressor, x: torch.Tensor, dst: int) -> Cost:
    cost = Cost()
    buf = _encode(c, x, cost)
    with _Timed(cost, "comm_s"):
        raw.send(torch.tensor([buf.numel()], dtype=torch.int64), dst)
        raw.send(buf, dst)
    cost.bytes_out = buf.numel()
    return cost


def recv(raw, c: Compressor, like: torch.Tensor, src: int) -> tuple[torch.Tensor, Cost]:
    cost = Cost()
    size = torch.empty(1, dtype=torch.int64)
    with _Timed(cost, "comm_s"):
        raw.recv(size, src)
        buf = torch.empty(int(size), dtype=torch.uint8, device=like.device)
        raw.recv(buf, src)
    cost.bytes_out = buf.numel()
    return _decode(c, buf, cost).view_as(like), cost
