"""The compressed all-reduce, two algorithms over segments of the message:

- "alltoall" (after DeepSpeed ZeRO++'s all_to_all_quant_reduce): each segment is cut into n
  equal chunks, one all-to-all of their payloads, a local fp32 sum of the chunk this rank
  owns, then one all_gather_into_tensor of the re-encoded sums. Every rank, the owner
  included, decodes the same payloads, so all ranks end bit-identical.
- "allgather" (small groups): one all-gather of whole payloads, local sum.

A variable-size codec reads its size tables once for the call's first phase and once for
its second (two host syncs); with error feedback one per segment for the second phase.
"""

from __future__ import annotations

import torch

from neoxlab.comm.collectives.chunks import Chunks, settle_residual
from neoxlab.comm.collectives.cost import Cost, Timed
from neoxlab.comm.collectives.exchange import (
    U8,
    SizePlan,
    encode_chunks,
    exchange,
    gather,
    gather_sizes,
    read_sizes,
    size_chunks,
    size_plans,
    sum_decoded,
)
from neoxlab.comm.payload import ChunkCodec
from neoxlab.comm_scratch import SEGMENT_BYTES, segment_bytes_for
from neoxlab.compress import Compressor


def all_reduce(raw, c: Compressor, x: torch.Tensor, group, n: int,
               residual: torch.Tensor | None = None, algorithm: str = "alltoall",
               segment_bytes: int = SEGMENT_BYTES) -> Cost:
    """Sum x over the group in place; with `residual`, error feedback (residual updated)."""
    cost = Cost()
    work = x if x.is_contiguous() else x.contiguous()
    flat = work.view(-1)
    res = residual.view(-1) if residual is not None else None
    step = max(n, segment_bytes_for(x.numel() * x.element_size(), segment_bytes)
               // x.element_size())
    step -= step % n
    per = n if algorithm == "alltoall" else 1  # chunks per segment
    parts = [Chunks(flat[lo: lo + step], per, None if res is None else res[lo: lo + step])
             for lo in range(0, flat.numel(), step)]
    codecs = [ChunkCodec(c, chunks.length, flat.dtype) for chunks in parts]
    plans = size_plans(raw, codecs, per, [chunks.load for chunks in parts], group, n, cost,
                        x.device)
    if algorithm == "alltoall" and res is None and codecs and codecs[0].fixed is None:
        _reduce_alltoall_variable(raw, codecs, parts, group, n, cost, plans)
    else:
        segment = _reduce_alltoall if algorithm == "alltoall" else _reduce_allgather
        for chunks, codec, plan in zip(parts, codecs, plans, strict=True):
            segment(raw, codec, chunks, group, n, cost, plan)
    if work is not x:
        x.copy_(work)
    return cost


def _encode_gathered(raw, codec: ChunkCodec, x: torch.Tensor, group, n: int,
                     cost: Cost) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(x's payload, every rank's payload of its own x), by one all-gather: a variable-size
    codec sizes x on the device, gathers the sizes and reads them (one host sync)."""
    device = x.device
    if codec.fixed is not None:
        with Timed(cost, "compress_s", device):
            mine = codec.encode(x, out=torch.empty(codec.fixed, dtype=U8, device=device))
        return mine, gather(raw, mine, codec, group, n, cost)
    size = size_chunks(codec, 1, lambda i: x, cost, device)
    own, every = read_sizes(size, gather_sizes(raw, size, group, n, cost))
    mine = encode_chunks(codec, 1, lambda i: x, cost, own)[0][0]
    return mine, gather(raw, mine, codec, group, n, cost, every)


def _owned_sum(raw, codec: ChunkCodec, chunks: Chunks, group, n: int, cost: Cost,
               plan: SizePlan, out: torch.Tensor | None = None
               ) -> tuple[list[torch.Tensor], torch.Tensor | None, torch.Tensor]:
    """The all-to-all all-reduce's first phase for one segment: (payloads sent, their
    buffer, the sum of this rank's chunk in the segment's dtype, written to `out` if given).
    Peers' payloads are decoded and summed in fp32 in rank order (a deterministic sum)."""
    device, dtype = chunks.flat.device, chunks.flat.dtype
    own, peers = plan if plan is not None else (None, None)
    payloads, send = encode_chunks(codec, n, chunks.load, cost, own, whole=chunks.load_all)
    received = exchange(raw, payloads, send, codec, group, cost, peers)
    scratch = torch.empty(chunks.length, dtype=dtype, device=device)
    total = torch.zeros(chunks.length, dtype=torch.float32, device=device)
    with Timed(cost, "decompress_s", device):
        sum_decoded(codec, received, scratch, total, rows=True)
    del received, scratch
    if out is not None:
        return payloads, send, out.copy_(total)
    return payloads, send, total if dtype == torch.float32 else total.to(dtype)


def _store_gathered(codec: ChunkCodec, chunks: Chunks, gathered: list[torch.Tensor],
                    cost: Cost) -> None:
    """Decode every owner's payload into its chunk of the segment (one codec call where
    the codec allows, Chunks.store_rows)."""
    with Timed(cost, "decompress_s", chunks.flat.device):
        if chunks.store_rows(codec, gathered):
            return
        scratch = torch.empty(chunks.length, dtype=chunks.flat.dtype,
                              device=chunks.flat.device)
        for i, payload in enumerate(gathered):
            chunks.store(i, lambda out, p=payload: codec.decode(p, out), scratch)


def _average_phases(cost: Cost, earlier: int, phase1: int, n: int) -> None:
    """Bytes on the wire of a segment: the all-to-all (one message's worth) plus one payload
    to n-1 peers, reported as the per-message average of the two phases."""
    phase2 = cost.bytes_out - earlier - phase1
    cost.bytes_out = earlier + (phase1 + phase2 * n) // 2


def _reduce_alltoall(raw, codec: ChunkCodec, chunks: Chunks, group, n: int, cost: Cost,
                     plan: SizePlan) -> None:
    """One segment: the sums of the owned chunks, then their payloads all-gathered (a
    variable-size codec reads their sizes: one host sync per segment)."""
    earlier = cost.bytes_out  # the message's segments before this one
    payloads, send, reduced = _owned_sum(raw, codec, chunks, group, n, cost, plan)
    phase1 = cost.bytes_out - earlier
    mine, gathered = _encode_gathered(raw, codec, reduced, group, n, cost)
    del reduced, mine
    _average_phases(cost, earlier, phase1, n)
    if chunks.residual is not None:
        scratch = torch.empty(chunks.length, dtype=chunks.flat.dtype, device=chunks.flat.device)
        settle_residual(chunks, codec, payloads, gathered, scratch, cost)
        del scratch
    del payloads, send
    _store_gathered(codec, chunks, gathered, cost)


def _reduce_alltoall_variable(raw, codecs: list[ChunkCodec], parts: list[Chunks], group,
                              n: int, cost: Cost, plans: list[SizePlan]) -> None:
    """All segments' first phase, then all their second phases, so that a variable-size
    codec reads the second phase's sizes once for the call (two host syncs in all, the
    first phase's table in `plans`). Without error feedback a segment's input is not read
    again once sent, so its first chunk's place holds the owned sum meanwhile."""
    device = parts[0].flat.device
    base, firsts = cost.bytes_out, []
    for chunks, codec, plan in zip(parts, codecs, plans, strict=True):
        earlier = cost.bytes_out
        held = chunks.flat[: chunks.length]  # chunk 0 is always full
        payloads, send, _ = _owned_sum(raw, codec, chunks, group, n, cost, plan, out=held)
        del payloads, send
        firsts.append(cost.bytes_out - earlier)
    cost.bytes_out = base  # counted per segment below, as _reduce_alltoall does
    loads = [lambda i, ch=chunks: ch.flat[: ch.length] for chunks in parts]
    second = size_plans(raw, codecs, 1, loads, group, n, cost, device)
    for chunks, codec, load, plan, phase1 in zip(parts, codecs, loads, second, firsts,
                                                 strict=True):
        own, every = plan if plan is not None else (None, None)
        payloads, _ = encode_chunks(codec, 1, load, cost, own)
        earlier = cost.bytes_out
        gathered = gather(raw, payloads[0], codec, group, n, cost, every)
        del payloads
        cost.bytes_out = earlier + (phase1 + (cost.bytes_out - earlier) * n) // 2
        _store_gathered(codec, chunks, gathered, cost)


def _reduce_allgather(raw, codec: ChunkCodec, whole: Chunks, group, n: int, cost: Cost,
                      plan: SizePlan) -> None:
    flat, res = whole.flat, whole.residual
    device, dtype = flat.device, flat.dtype
    scratch = torch.empty_like(flat)
    own, every = plan if plan is not None else (None, None)
    payloads, send = encode_chunks(codec, 1, whole.load, cost, own)
    gathered = gather(raw, payloads[0], codec, group, n, cost, every)
    if res is not None:
        settle_residual(whole, codec, payloads, gathered, scratch, cost)
    del payloads, send
    # two terms sum exactly in their own precision; more need an fp32 accumulator
    total = flat if n <= 2 or dtype == torch.float32 else torch.empty(
        flat.numel(), dtype=torch.float32, device=device)
    with Timed(cost, "decompress_s", device):
        codec.decode(gathered[0], total if total is flat else scratch)
        if total is not flat:
            total.copy_(scratch)
        for payload in gathered[1:]:
            total += codec.decode(payload, scratch)
        if total is not flat:
            flat.copy_(total)
