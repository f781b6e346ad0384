"""Point-to-point benchmarks: latency (ping-pong), multi-pair latency, bw and bibw (windows).

Ranks pair up as (r, r + n/2), so latency is multi_lat on two ranks. The ping-pong loop is
fused (two bound calls per iteration, nothing else; with OSU timing a clock around each
round trip, as osu_latency 7.4), which keeps Python overhead at one method call per message.
"""

from __future__ import annotations

import numpy as np

from .context import Ctx
from .options import DTYPES
from .timing import Op

TAG_DATA, TAG_ACK = 1, 2


def peer_of(rank: int, size: int) -> int:
    half = size // 2
    return rank + half if rank < half else rank - half


def latency(ctx: Ctx, size: int) -> Op:
    count = size // ctx.dt.itemsize
    peer = peer_of(ctx.rank, ctx.size)
    sbuf, rbuf = ctx.alloc(count), ctx.alloc(count)
    send = ctx.backend.send(sbuf, count, ctx.dt, peer, TAG_DATA)
    recv = ctx.backend.recv(rbuf, count, ctx.dt, peer, TAG_DATA)
    first, second = (send, recv) if ctx.rank < peer else (recv, send)

    def call() -> None:
        first()
        second()

    def loop(n: int) -> None:
        for _ in range(n):
            first()
            second()

    def fill(it: int) -> None:
        ctx.write(sbuf, ctx.source(count, ctx.rank, it, injector=0))
        ctx.write(rbuf, ctx.patterns.sentinel(count))

    def check(it: int) -> bool:
        return bool(np.array_equal(ctx.read(rbuf), ctx.patterns.data(count, peer, it)))

    return Op(call=call, loop=loop, fill=fill, check=check, divisor=2, timed=ctx.rank < peer,
              parts=(first, second))


def bw(ctx: Ctx, size: int, bidirectional: bool) -> Op:
    """A window of messages then (bw only) a one-element ack, as OSU's osu_bw/osu_bibw."""
    count, window = size // ctx.dt.itemsize, ctx.opts.window
    peer = peer_of(ctx.rank, ctx.size)
    sender = ctx.rank < peer
    sbuf, rbuf = ctx.alloc(count), ctx.alloc(count)
    msgs_out = [(sbuf, count, peer, TAG_DATA)] * window
    msgs_in = [(rbuf, count, peer, TAG_DATA)] * window
    if bidirectional:
        win, close = ctx.backend.window(msgs_out, msgs_in, ctx.dt)
        call = win
        parts: tuple = (win,)
    else:
        char = DTYPES["char"]
        ack_buf = ctx.kind.alloc(4, char)
        if sender:
            win, close = ctx.backend.window(msgs_out, [], ctx.dt)
            ack = ctx.backend.recv(ack_buf, 4, char, peer, TAG_ACK)
        else:
            win, close = ctx.backend.window([], msgs_in, ctx.dt)
            ack = ctx.backend.send(ack_buf, 4, char, peer, TAG_ACK)

        def call() -> None:
            win()
            ack()

        parts = (win, ack)

    receives = bidirectional or not sender

    def fill(it: int) -> None:
        ctx.write(sbuf, ctx.source(count, ctx.rank, it, injector=0))
        ctx.write(rbuf, ctx.patterns.sentinel(count))

    def check(it: int) -> bool:
        if not receives:
            return True
        return bool(np.array_equal(ctx.read(rbuf), ctx.patterns.data(count, peer, it)))

    return Op(call=call, fill=fill, check=check, divisor=window, close=close,
              timed=sender or bidirectional, parts=parts)


def build(ctx: Ctx, size: int) -> Op:
    name = ctx.opts.benchmark
    if name in ("latency", "multi_lat"):
        return latency(ctx, size)
    return bw(ctx, size, bidirectional=name == "bibw")
