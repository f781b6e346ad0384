"""Compressed collectives through neoxlab.compress, built for measurement, not for speed.

allreduce = encode, all-gather the encoded buffers (sizes first), decode all, sum locally in
rank order; allgather = all-gather of encoded buffers; reduce_scatter = all-to-all of encoded
chunks, decode, sum; bcast = broadcast of the encoded buffer (size first); latency =
ping-pong of encoded buffers. The timed call includes encoding and decoding, so latency and
bandwidth are effective values on the uncompressed bytes.

Validation: lossless compressors must reproduce the uncompressed result bit for bit. A
lossy result passes when every element is within the sum, over the contributions that make
it, of that contribution's largest round-trip error |decode(encode(x)) - x| (each rank
recomputes it locally from the known input), plus float rounding of the summation
(n * eps * sum of max |x|). Misrouted or corrupted data lands far outside that bound.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .context import Ctx
from .timing import Op
from .validate import SMOOTH_PERIOD, matches

ROOT = 0


def load_compressor(spec: str) -> Any:
    """Import neoxlab.compress only when --compress is used."""
    # function-level: neoxlab.compress needs torch; benchmarks without --compress must not
    from neoxlab.compress import make_compressor

    return make_compressor(spec)


class Tolerance:
    """Per-contribution round-trip errors of a lossy compressor on the known inputs."""

    def __init__(self, ctx: Ctx):
        self.ctx, self.cache = ctx, {}
        self.lossless = bool(getattr(ctx.compressor, "lossless", False))
        self.eps = float(np.finfo(ctx.dt.numpy).eps)

    def error(self, count: int, seed: int, it: int, start: int = 0, length: int | None = None):
        key = (count, seed, it % SMOOTH_PERIOD, start, length)
        if key not in self.cache:
            import torch

            x = self.ctx.patterns.data(count, seed, it)[start:None if length is None
                                                          else start + length]
            comp = self.ctx.compressor
            t = torch.from_numpy(x.copy()).to(self.ctx.kind.dev)  # same device as the run
            y = comp.decode(comp.encode(t)).cpu().numpy().reshape(-1)
            err = float(np.abs(y.astype(np.float64) - x).max()) if x.size else 0.0
            self.cache[key] = (err, float(np.abs(x).max()) if x.size else 0.0)
        return self.cache[key]

    def bound(self, parts: list[tuple[float, float]]) -> float | None:
        """None (exact) for lossless; else summed errors plus summation rounding."""
        if self.lossless:
            return None
        return sum(e for e, _ in parts) + len(parts) * self.eps * sum(m for _, m in parts) * 2


def _u8(ctx: Ctx, nbytes: int):
    import torch

    return torch.empty(nbytes, dtype=torch.uint8, device=ctx.kind.dev)


def _capacity(ctx: Ctx, count: int) -> int:
    """Bytes to preallocate for one encoded buffer of `count` elements."""
    return int(ctx.compressor.max_encoded_bytes(count, ctx.kind.torch_dtype(ctx.dt)))


def _fillers(ctx: Ctx, x, res, injector: int):
    """Input for iteration `it` (and the result reset to a sentinel), or priming data."""
    def fill(it: int) -> None:
        ctx.write(x, ctx.source(x.numel(), ctx.rank, it, injector))
        ctx.write(res, ctx.patterns.sentinel(res.numel()))

    def prime() -> None:
        ctx.write(x, ctx.patterns.data(x.numel(), ctx.rank, 0))

    return fill, prime


def _check(ctx: Ctx, got, expected: np.ndarray, tol: float | None) -> bool:
    return matches(got.detach().cpu().numpy().reshape(-1), expected, tol)


def allreduce(ctx: Ctx, count: int) -> Op:
    comp, be, n, tol = ctx.compressor, ctx.backend, ctx.size, Tolerance(ctx)
    cap = _capacity(ctx, count)
    x, res = ctx.alloc(count), ctx.alloc(count)
    out, pad = _u8(ctx, n * cap), _u8(ctx, cap)
    counters = {"bytes": count * ctx.dt.itemsize, "wire": 0}

    def call() -> None:
        enc = comp.encode(x)
        parts = be.allgatherv_bytes(enc, out, pad)
        res.copy_(comp.decode(parts[0]).reshape(-1))
        for p in parts[1:]:
            res.add_(comp.decode(p).reshape(-1))
        counters["wire"] = int(enc.numel())

    def check(it: int) -> bool:
        expected = ctx.patterns.total(count, list(range(n)), it)
        bound = tol.bound([tol.error(count, j, it) for j in range(n)])
        return _check(ctx, res, expected, bound)

    fill, prime = _fillers(ctx, x, res, injector=n - 1)
    return Op(call=call, fill=fill, check=check, prime=prime, counters=counters)


def allgather(ctx: Ctx, count: int) -> Op:
    comp, be, n, tol = ctx.compressor, ctx.backend, ctx.size, Tolerance(ctx)
    cap = _capacity(ctx, count)
    x, res = ctx.alloc(count), ctx.alloc(count * n)
    out, pad = _u8(ctx, n * cap), _u8(ctx, cap)
    blocks = list(res.split(count))
    counters = {"bytes": count * ctx.dt.itemsize, "wire": 0}

    def call() -> None:
        enc = comp.encode(x)
        for block, p in zip(blocks, be.allgatherv_bytes(enc, out, pad), strict=True):
            block.copy_(comp.decode(p).reshape(-1))
        counters["wire"] = int(enc.numel())

    def check(it: int) -> bool:
        got = res.detach().cpu().numpy()
        for j in range(n):
            expected = ctx.patterns.data(count, j, it)
            bound = tol.bound([tol.error(count, j, it)])
            if not matches(got[j * count:(j + 1) * count], expected, bound):
                return False
        return True

    fill, prime = _fillers(ctx, x, res, injector=n - 1)
    return Op(call=call, fill=fill, check=check, prime=prime, counters=counters)


def reduce_scatter(ctx: Ctx, count: int) -> Op:
    """Equal blocks (input padded up to a multiple of the rank count, as torch needs)."""
    comp, be, n, rank, tol = ctx.compressor, ctx.backend, ctx.size, ctx.rank, Tolerance(ctx)
    block = max(1, -(-count // n))
    total = block * n
    cap = _capacity(ctx, block)
    x, res = ctx.alloc(total), ctx.alloc(block)
    chunks = list(x.split(block))
    send, out = _u8(ctx, n * cap), _u8(ctx, n * cap)
    counters = {"bytes": total * ctx.dt.itemsize, "wire": 0}

    def call() -> None:
        encs = [comp.encode(c) for c in chunks]
        parts = be.alltoallv_bytes(encs, send, out)
        res.copy_(comp.decode(parts[0]).reshape(-1))
        for p in parts[1:]:
            res.add_(comp.decode(p).reshape(-1))
        counters["wire"] = sum(int(e.numel()) for e in encs)

    def check(it: int) -> bool:
        expected = ctx.patterns.total(total, list(range(n)), it, rank * block, block)
        bound = tol.bound([tol.error(total, j, it, rank * block, block) for j in range(n)])
        return _check(ctx, res, expected, bound)

    fill, prime = _fillers(ctx, x, res, injector=n - 1)
    return Op(call=call, fill=fill, check=check, prime=prime, counters=counters)


def bcast(ctx: Ctx, count: int) -> Op:
    comp, be, tol = ctx.compressor, ctx.backend, Tolerance(ctx)
    cap = _capacity(ctx, count)
    root = ctx.rank == ROOT
    x = ctx.alloc(count)
    out = _u8(ctx, cap)
    counters = {"bytes": count * ctx.dt.itemsize if root else 0, "wire": 0}

    def call() -> None:
        if root:
            enc = comp.encode(x)
            be.bcast_bytes(enc, out, ROOT)
            counters["wire"] = int(enc.numel())
        else:
            x.copy_(comp.decode(be.bcast_bytes(None, out, ROOT)).reshape(-1))

    def fill(it: int) -> None:
        if root:
            ctx.write(x, ctx.source(count, ROOT, it, injector=ROOT))
        else:
            ctx.write(x, ctx.patterns.sentinel(count))

    def prime() -> None:
        ctx.write(x, ctx.patterns.data(count, ROOT, 0))

    def check(it: int) -> bool:
        if root:
            return True
        expected = ctx.patterns.data(count, ROOT, it)
        return _check(ctx, x, expected, tol.bound([tol.error(count, ROOT, it)]))

    return Op(call=call, fill=fill, check=check, prime=prime, counters=counters)


def latency(ctx: Ctx, count: int) -> Op:
    from .pt2pt import peer_of

    comp, be, tol = ctx.compressor, ctx.backend, Tolerance(ctx)
    cap = _capacity(ctx, count)
    peer = peer_of(ctx.rank, ctx.size)
    first = ctx.rank < peer
    x, res = ctx.alloc(count), ctx.alloc(count)
    out = _u8(ctx, cap)
    counters = {"bytes": count * ctx.dt.itemsize, "wire": 0}

    def send() -> None:
        enc = comp.encode(x)
        be.send_bytes(enc, peer)
        counters["wire"] = int(enc.numel())

    def recv() -> None:
        res.copy_(comp.decode(be.recv_bytes(out, peer)).reshape(-1))

    def call() -> None:
        if first:
            send()
            recv()
        else:
            recv()
            send()

    def check(it: int) -> bool:
        expected = ctx.patterns.data(count, peer, it)
        return _check(ctx, res, expected, tol.bound([tol.error(count, peer, it)]))

    fill, prime = _fillers(ctx, x, res, injector=0)
    return Op(call=call, fill=fill, check=check, prime=prime, counters=counters, divisor=2,
              timed=first)


def build(ctx: Ctx, size: int) -> Op:
    count = size // ctx.dt.itemsize
    builders = {"allreduce": allreduce, "allgather": allgather, "reduce_scatter": reduce_scatter,
                "bcast": bcast, "latency": latency}
    return builders[ctx.opts.benchmark](ctx, count)
