"""Whole-message collectives in segments: all-gather, reduce-scatter and broadcast, one
compressed payload per rank and segment, so their scratch stays a bounded fraction of the
message (comm_scratch.op_scratch_bytes)."""

from __future__ import annotations

import torch

from neoxlab.comm.collectives.chunks import copy_back, flat_targets, segments
from neoxlab.comm.collectives.cost import Cost, Timed
from neoxlab.comm.collectives.exchange import (
    U8,
    decode_each,
    encode_chunks,
    exchange,
    gather,
    read_sizes,
    size_chunks,
    size_plans,
    sum_decoded,
)
from neoxlab.comm.payload import ChunkCodec
from neoxlab.comm_scratch import SEGMENT_BYTES
from neoxlab.compress import Compressor


def all_gather_into(raw, c: Compressor, x: torch.Tensor, outputs: list[torch.Tensor], group,
                    n: int, segment_bytes: int = SEGMENT_BYTES) -> Cost:
    """Compressed all-gather: outputs[i] = decoded payload of rank i (own one included),
    segment by segment."""
    cost = Cost()
    flat = x.contiguous().view(-1)
    targets = flat_targets(outputs)
    bounds = segments(flat.numel(), x.element_size(), segment_bytes)
    loads = [lambda i, lo=lo, hi=hi: flat[lo:hi] for lo, hi in bounds]
    codecs = [ChunkCodec(c, hi - lo, x.dtype) for lo, hi in bounds]
    plans = size_plans(raw, codecs, 1, loads, group, n, cost, x.device)
    for (lo, hi), load, codec, plan in zip(bounds, loads, codecs, plans, strict=True):
        own, every = plan if plan is not None else (None, None)
        payloads, send = encode_chunks(codec, 1, load, cost, own)
        gathered = gather(raw, payloads[0], codec, group, n, cost, every)
        del payloads, send
        with Timed(cost, "decompress_s", x.device):
            decode_each(codec, gathered, [t[lo:hi] for t in targets])
        del gathered
    copy_back(outputs, targets)
    return cost


def reduce_scatter(raw, c: Compressor, x: torch.Tensor, out: torch.Tensor, group,
                   n: int, segment_bytes: int = SEGMENT_BYTES) -> Cost:
    """x holds n equal chunks; out = the fp32 sum of everyone's chunk of this rank. In
    segments: the same slice of every chunk at a time."""
    cost = Cost()
    parts = x.contiguous().view(n, -1)
    (target,) = flat_targets([out])
    bounds = segments(parts.shape[1], x.element_size() * n, segment_bytes)
    codecs = [ChunkCodec(c, hi - lo, x.dtype) for lo, hi in bounds]
    loads = [lambda i, lo=lo, hi=hi: parts[i, lo:hi] for lo, hi in bounds]
    plans = size_plans(raw, codecs, n, loads, group, n, cost, x.device)
    for (lo, hi), load, codec, plan in zip(bounds, loads, codecs, plans, strict=True):
        own, peers = plan if plan is not None else (None, None)
        payloads, send = encode_chunks(codec, n, load, cost, own)
        received = exchange(raw, payloads, send, codec, group, cost, peers)
        del payloads, send
        scratch = torch.empty(hi - lo, dtype=x.dtype, device=x.device)
        total = torch.zeros(hi - lo, dtype=torch.float32, device=x.device)
        with Timed(cost, "decompress_s", x.device):
            sum_decoded(codec, received, scratch, total)
        del received, scratch
        target[lo:hi].copy_(total)
        del total
    copy_back([out], [target])
    return cost


def broadcast(raw, c: Compressor, x: torch.Tensor, src: int, me: int, group,
              segment_bytes: int = SEGMENT_BYTES) -> Cost:
    """The source sends one payload per segment; every rank, the source too, takes the
    decoded values. A variable-size codec's source broadcasts its sizes of every segment
    first."""
    cost = Cost()
    device = x.device
    flat = x.contiguous().view(-1)
    bounds = segments(flat.numel(), x.element_size(), segment_bytes)
    codecs = [ChunkCodec(c, hi - lo, x.dtype) for lo, hi in bounds]
    sizes: list[int | None] = [codec.fixed for codec in codecs]
    if codecs[0].fixed is None:
        if me == src:
            table = torch.cat([size_chunks(codec, 1, lambda i, lo=lo, hi=hi: flat[lo:hi], cost,
                                           device)
                               for (lo, hi), codec in zip(bounds, codecs, strict=True)])
        else:
            table = torch.empty(len(bounds), dtype=torch.int64, device=device)
        with Timed(cost, "comm_s", device):
            raw.broadcast(table, src, group=group)
        (sizes,) = read_sizes(table)
    for (lo, hi), codec, size in zip(bounds, codecs, sizes, strict=True):
        if me == src:
            payload = encode_chunks(codec, 1, lambda i, lo=lo, hi=hi: flat[lo:hi], cost,
                                    None if codec.fixed is not None else [size])[0][0]
        else:
            payload = torch.empty(size, dtype=U8, device=device)
        with Timed(cost, "comm_s", device):
            raw.broadcast(payload, src, group=group)
        cost.bytes_out += payload.numel()
        with Timed(cost, "decompress_s", device):
            codec.decode(payload, flat[lo:hi])
        del payload
    if flat.data_ptr() != x.data_ptr():
        x.copy_(flat.view_as(x))
    return cost
