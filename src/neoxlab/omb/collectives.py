"""Blocking collectives: buffer layout, the bound call, and what each rank must receive.

Message size follows OSU: per-rank block for allgather, alltoall (per peer), gather and
scatter; the whole buffer for allreduce, reduce, bcast and reduce_scatter (whose result is
split over the ranks, the remainder to the lowest ranks; torch.distributed needs equal
blocks, so there the input is padded up to a multiple of the rank count).
Inputs come from the rank that --inject-error corrupts: the root for bcast and scatter,
the last rank everywhere else.
"""

from __future__ import annotations

import numpy as np

from .context import Ctx
from .timing import Op

ROOT = 0


def split_counts(count: int, n: int, equal: bool) -> list[int]:
    """Per-rank result counts of a reduce_scatter over `count` elements."""
    if equal:
        return [max(1, -(-count // n))] * n
    base, extra = divmod(count, n)
    return [base + (1 if j < extra else 0) for j in range(n)]


def _blocks(ctx: Ctx, count: int, seeds: list[int], it: int) -> np.ndarray:
    return np.concatenate([ctx.patterns.data(count, s, it) for s in seeds])


def _same(ctx: Ctx, buf, expected: np.ndarray) -> bool:
    return bool(np.array_equal(ctx.read(buf), expected))


def reduction(ctx: Ctx, count: int, rooted: bool) -> Op:
    """allreduce, or reduce to ROOT; torch.distributed reduces in place in one tensor."""
    n, last = ctx.size, ctx.size - 1
    r = ctx.alloc(count)
    s = r if ctx.backend.in_place_reductions else ctx.alloc(count)
    if rooted:
        call = ctx.backend.reduce(s, r, count, ctx.dt, ROOT)
    else:
        call = ctx.backend.allreduce(s, r, count, ctx.dt)

    def fill(it: int) -> None:
        if r is not s:
            ctx.write(r, ctx.patterns.sentinel(count))
        ctx.write(s, ctx.source(count, ctx.rank, it, injector=last))

    def check(it: int) -> bool:
        if rooted and ctx.rank != ROOT:
            return True
        return _same(ctx, r, ctx.patterns.total(count, list(range(n)), it))

    return Op(call=call, fill=fill, check=check)


def reduce_scatter(ctx: Ctx, count: int) -> Op:
    n, last = ctx.size, ctx.size - 1
    counts = split_counts(count, n, equal=ctx.backend.in_place_reductions)
    total, mine = sum(counts), counts[ctx.rank]
    start = sum(counts[:ctx.rank])
    s, r = ctx.alloc(total), ctx.alloc(mine)
    call = ctx.backend.reduce_scatter(s, r, counts, ctx.dt)

    def fill(it: int) -> None:
        ctx.write(s, ctx.source(total, ctx.rank, it, injector=last))
        ctx.write(r, ctx.patterns.sentinel(mine))

    def check(it: int) -> bool:
        if mine == 0:
            return True
        return _same(ctx, r, ctx.patterns.total(total, list(range(n)), it, start, mine))

    return Op(call=call, fill=fill, check=check)


def allgather(ctx: Ctx, count: int, rooted: bool) -> Op:
    """allgather, or gather to ROOT: block j of the result is rank j's input."""
    n, last = ctx.size, ctx.size - 1
    s, r = ctx.alloc(count), ctx.alloc(count * n)
    if rooted:
        call = ctx.backend.gather(s, r, count, ctx.dt, ROOT)
    else:
        call = ctx.backend.allgather(s, r, count, ctx.dt)

    def fill(it: int) -> None:
        ctx.write(s, ctx.source(count, ctx.rank, it, injector=last))
        ctx.write(r, ctx.patterns.sentinel(count * n))

    def check(it: int) -> bool:
        if rooted and ctx.rank != ROOT:
            return True
        return _same(ctx, r, _blocks(ctx, count, list(range(n)), it))

    return Op(call=call, fill=fill, check=check)


def alltoall(ctx: Ctx, count: int) -> Op:
    """Block d of rank r's input uses seed r*n+d, so every (sender, receiver) pair differs."""
    n, rank, last = ctx.size, ctx.rank, ctx.size - 1
    s, r = ctx.alloc(count * n), ctx.alloc(count * n)
    call = ctx.backend.alltoall(s, r, count, ctx.dt)

    def fill(it: int) -> None:
        values = _blocks(ctx, count, [rank * n + d for d in range(n)], it)
        if ctx.opts.inject_error and rank == last:
            values = ctx.patterns.corrupt(values)
        ctx.write(s, values)
        ctx.write(r, ctx.patterns.sentinel(count * n))

    def check(it: int) -> bool:
        return _same(ctx, r, _blocks(ctx, count, [j * n + rank for j in range(n)], it))

    return Op(call=call, fill=fill, check=check)


def scatter(ctx: Ctx, count: int) -> Op:
    n, rank = ctx.size, ctx.rank
    s, r = ctx.alloc(count * n), ctx.alloc(count)
    call = ctx.backend.scatter(s, r, count, ctx.dt, ROOT)

    def fill(it: int) -> None:
        if rank == ROOT:
            values = _blocks(ctx, count, list(range(n)), it)
            if ctx.opts.inject_error:
                values = ctx.patterns.corrupt(values)
            ctx.write(s, values)
        ctx.write(r, ctx.patterns.sentinel(count))

    def check(it: int) -> bool:
        return _same(ctx, r, ctx.patterns.data(count, rank, it))

    return Op(call=call, fill=fill, check=check)


def bcast(ctx: Ctx, count: int) -> Op:
    buf = ctx.alloc(count)
    call = ctx.backend.bcast(buf, count, ctx.dt, ROOT)

    def fill(it: int) -> None:
        if ctx.rank == ROOT:
            ctx.write(buf, ctx.source(count, ROOT, it, injector=ROOT))
        else:
            ctx.write(buf, ctx.patterns.sentinel(count))

    def check(it: int) -> bool:
        return ctx.rank == ROOT or _same(ctx, buf, ctx.patterns.data(count, ROOT, it))

    return Op(call=call, fill=fill, check=check)


def barrier(ctx: Ctx) -> Op:
    """No data to check: validation reports completion (and --inject-error a failure)."""
    fail = ctx.opts.inject_error and ctx.rank == ROOT
    return Op(call=ctx.backend.barrier(), check=lambda it: not fail)


def build(ctx: Ctx, size: int) -> Op:
    name, count = ctx.opts.benchmark, size // ctx.dt.itemsize
    if name == "barrier":
        return barrier(ctx)
    if name in ("allreduce", "reduce"):
        return reduction(ctx, count, rooted=name == "reduce")
    if name == "reduce_scatter":
        return reduce_scatter(ctx, count)
    if name in ("allgather", "gather"):
        return allgather(ctx, count, rooted=name == "gather")
    if name == "alltoall":
        return alltoall(ctx, count)
    if name == "scatter":
        return scatter(ctx, count)
    return bcast(ctx, count)
