"""Point-to-point compressed collectives: send/recv of one payload per segment, and reduce
(ZeRO's per-partition reduce to its owner: every other rank sends the owner one payload per
segment, the owner alone decodes). A variable-size codec sends its sizes first."""

from __future__ import annotations

import torch

from neoxlab.comm.collectives.chunks import (
    Chunks,
    all_finite,
    copy_back,
    flat_targets,
    segments,
    settle_residual,
)
from neoxlab.comm.collectives.cost import Cost, Timed
from neoxlab.comm.collectives.exchange import (
    U8,
    SizePlan,
    by_segment,
    encode_chunks,
    read_sizes,
    size_chunks,
)
from neoxlab.comm.payload import ChunkCodec
from neoxlab.comm_scratch import SEGMENT_BYTES, segment_bytes_for
from neoxlab.compress import Compressor


def send(raw, c: Compressor, x: torch.Tensor, dst: int, group=None,
         segment_bytes: int = SEGMENT_BYTES) -> Cost:
    """One payload per segment (a variable-size codec sends the sizes of every segment
    first); the receiver cuts the same segments from the same numel."""
    cost = Cost()
    flat = x.contiguous().view(-1)
    bounds = segments(flat.numel(), x.element_size(), segment_bytes)
    codecs = [ChunkCodec(c, hi - lo, x.dtype) for lo, hi in bounds]
    sizes: list[int | None] = [None] * len(bounds)
    if codecs[0].fixed is None:
        table = torch.cat([size_chunks(codec, 1, lambda i, lo=lo, hi=hi: flat[lo:hi], cost,
                                       x.device)
                           for (lo, hi), codec in zip(bounds, codecs, strict=True)])
        with Timed(cost, "comm_s", x.device):
            raw.send(table, dst, group=group)
        (sizes,) = read_sizes(table)
    for (lo, hi), codec, size in zip(bounds, codecs, sizes, strict=True):
        payloads, buf = encode_chunks(codec, 1, lambda i, lo=lo, hi=hi: flat[lo:hi], cost,
                                      None if size is None else [size])
        _send_payload(raw, codec, payloads[0], dst, group, cost)
        cost.bytes_out += payloads[0].numel()
        del payloads, buf
    return cost


def recv(raw, c: Compressor, x: torch.Tensor, src: int, group=None,
         segment_bytes: int = SEGMENT_BYTES) -> Cost:
    """Receive the payloads of `src`'s segments (and first their sizes, for a
    variable-size codec) and decode them into x."""
    cost = Cost()
    device = x.device
    (flat,) = flat_targets([x])
    bounds = segments(flat.numel(), x.element_size(), segment_bytes)
    codecs = [ChunkCodec(c, hi - lo, x.dtype) for lo, hi in bounds]
    sizes: list[int | None] = [None] * len(bounds)
    if codecs[0].fixed is None:
        table = torch.empty(len(bounds), dtype=torch.int64, device=device)
        with Timed(cost, "comm_s", device):
            raw.recv(table, src, group=group)
        (sizes,) = read_sizes(table)
    for (lo, hi), codec, size in zip(bounds, codecs, sizes, strict=True):
        payload = _recv_payload(raw, codec, src, group, cost, device, size)
        cost.bytes_out += payload.numel()
        with Timed(cost, "decompress_s", device):
            codec.decode(payload, flat[lo:hi])
        del payload
    copy_back([x], [flat])
    return cost


def reduce(raw, c: Compressor, x: torch.Tensor, dst: int, ranks: list[int], me: int, group,
           residual: torch.Tensor | None = None, segment_bytes: int = SEGMENT_BYTES) -> Cost:
    """Sum x over the group into dst's x; the other ranks' x stay as they were (torch leaves
    them unspecified). ZeRO-1/2 reduce each gradient partition to the rank that keeps it, so
    only that rank decodes: every other rank sends it one payload per segment, and it sums
    the decoded payloads in fp32 in rank order (`ranks`: the group's global ranks). A
    variable-size codec's senders send their sizes of every segment first."""
    cost = Cost()
    work = x if x.is_contiguous() else x.contiguous()
    flat = work.view(-1)
    res = residual.view(-1) if residual is not None else None
    step = max(1, segment_bytes_for(x.numel() * x.element_size(), segment_bytes)
               // x.element_size())
    parts = [Chunks(flat[lo: lo + step], 1, None if res is None else res[lo: lo + step])
             for lo in range(0, flat.numel(), step)]
    codecs = [ChunkCodec(c, chunks.flat.numel(), x.dtype) for chunks in parts]
    plans = _p2p_plans(raw, parts, codecs, dst, ranks, me, group, cost)
    for chunks, codec, plan in zip(parts, codecs, plans, strict=True):
        _reduce_to(raw, codec, chunks, dst, ranks, me, group, cost, plan)
    if work is not x and me == dst:
        x.copy_(work)
    return cost


def _p2p_plans(raw, parts: list[Chunks], codecs: list[ChunkCodec], dst: int,
               ranks: list[int], me: int, group, cost: Cost) -> list[SizePlan]:
    """Per segment (own size, the sizes of ranks' payloads in `ranks` order: the
    destination's only), from one host read; Nones for a fixed-rate codec."""
    if not parts or codecs[0].fixed is not None:
        return [None] * len(parts)
    device = parts[0].flat.device
    mine = torch.cat([size_chunks(codec, 1, chunks.load, cost, device)
                      for chunks, codec in zip(parts, codecs, strict=True)])
    if me != dst:
        with Timed(cost, "comm_s", device):
            raw.send(mine, dst, group=group)
        (own,) = read_sizes(mine)
        return [([size], []) for size in own]
    tables = []
    for r in ranks:
        if r == me:
            tables.append(mine)
            continue
        theirs = torch.empty_like(mine)
        with Timed(cost, "comm_s", device):
            raw.recv(theirs, r, group=group)
        tables.append(theirs)
    (got,) = read_sizes(torch.stack(tables))
    every = by_segment(got, len(parts))
    return [([peers[ranks.index(me)]], peers) for peers in every]


def _reduce_to(raw, codec: ChunkCodec, whole: Chunks, dst: int, ranks: list[int], me: int,
               group, cost: Cost, plan: SizePlan) -> None:
    flat, res = whole.flat, whole.residual
    device = flat.device
    own, peers = plan if plan is not None else (None, None)
    sent, _ = encode_chunks(codec, 1, whole.load, cost, own)
    cost.bytes_out += sent[0].numel()  # the message's size on the wire, as for all ranks
    scratch = torch.empty_like(flat)
    if me != dst:
        _send_payload(raw, codec, sent[0], dst, group, cost)
        if res is not None:  # error feedback sees this rank's own payload only
            settle_residual(whole, codec, sent, sent, scratch, cost)
        return
    received = [sent[0] if r == me else
                _recv_payload(raw, codec, r, group, cost, device,
                              None if peers is None else peers[k])
                for k, r in enumerate(ranks)]
    total = torch.zeros(flat.numel(), dtype=torch.float32, device=device)
    with Timed(cost, "decompress_s", device):
        for payload in received:
            total += codec.decode(payload, scratch)
    if res is not None:  # before the sum overwrites flat, which load() reads
        settle_residual(whole, codec, sent, [], scratch, cost, all_finite(total))
    flat.copy_(total)


def _send_payload(raw, codec: ChunkCodec, payload: torch.Tensor, dst: int, group,
                  cost: Cost) -> None:
    with Timed(cost, "comm_s", payload.device):
        raw.send(payload, dst, group=group)


def _recv_payload(raw, codec: ChunkCodec, src: int, group, cost: Cost,
                  device: torch.device, nbytes: int | None = None) -> torch.Tensor:
    """The payload src sends; a variable-size one of nbytes (its sizes came first)."""
    size = codec.fixed if codec.fixed is not None else nbytes
    assert size is not None, "a variable-size payload is received with its known size"
    payload = torch.empty(size, dtype=U8, device=device)
    with Timed(cost, "comm_s", device):
        raw.recv(payload, src, group=group)
    return payload
