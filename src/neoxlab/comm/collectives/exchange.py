"""Moving payloads: the size tables of variable-size codecs (sized on the device, read on the
host once a call), the all-to-all and all-gather of payloads, and encoding/decoding the
chunks of a segment."""

from __future__ import annotations

from collections.abc import Callable

import torch

from neoxlab.comm.collectives.cost import Cost, Timed
from neoxlab.comm.payload import ChunkCodec, joined

U8 = torch.uint8

SizePlan = tuple[list[int], list[int]] | None  # (this rank's sizes, the peers'), or fixed


def read_sizes(*tables: torch.Tensor) -> list[list[int]]:
    """Device size tables read on the host together: a variable-size call's one host sync
    (its sizes are data-dependent, and the host allocates the buffers and the splits)."""
    flat = torch.cat([t.reshape(-1) for t in tables]).tolist()
    out, at = [], 0
    for t in tables:
        out.append(flat[at: at + t.numel()])
        at += t.numel()
    return out


def by_segment(sizes: list[int], segments: int) -> list[list[int]]:
    """A flat size table laid out (peer, segment) as one list of the peers' sizes per
    segment."""
    peers = len(sizes) // max(segments, 1)
    return [[sizes[j * segments + s] for j in range(peers)] for s in range(segments)]


def exchange_sizes(raw, mine: torch.Tensor, group, cost: Cost) -> torch.Tensor:
    """All-to-all of a (segments, n) device table of this rank's payload sizes (peer j's
    payload in column j): returns the (n, segments) table of what each peer sends here."""
    segments, n = mine.shape
    out = torch.empty(n * segments, dtype=torch.int64, device=mine.device)
    with Timed(cost, "comm_s", mine.device):
        raw.all_to_all_single(out, mine.t().contiguous().view(-1), group=group)
    return out.view(n, segments)


def gather_sizes(raw, mine: torch.Tensor, group, n: int, cost: Cost) -> torch.Tensor:
    """All-gather of a (segments,) device vector of payload sizes: the (n, segments) table."""
    out = torch.empty(n * mine.numel(), dtype=torch.int64, device=mine.device)
    with Timed(cost, "comm_s", mine.device):
        raw.all_gather_into_tensor(out, mine.contiguous(), group=group)
    return out.view(n, -1)


def exchange(raw, payloads: list[torch.Tensor], send: torch.Tensor | None, codec: ChunkCodec,
             group, cost: Cost, recv_sizes: list[int] | None = None) -> list[torch.Tensor]:
    """All-to-all: payloads[i] goes to peer i; returns what each peer sent here. Fixed
    payloads travel as one buffer of equal slots; variable ones with their sizes known on
    the host already (recv_sizes: what each peer sends here)."""
    n, device = len(payloads), payloads[0].device
    if codec.fixed is not None:
        recv = torch.empty(n * codec.fixed, dtype=U8, device=device)
        with Timed(cost, "comm_s", device):
            raw.all_to_all_single(recv, send, group=group)
        cost.bytes_out += send.numel()
        return list(recv.split(codec.fixed))
    assert recv_sizes is not None, "a variable-size exchange needs the sizes it receives"
    send_sizes = [p.numel() for p in payloads]
    recv = torch.empty(sum(recv_sizes), dtype=U8, device=device)
    with Timed(cost, "comm_s", device):
        raw.all_to_all_single(recv, torch.cat(payloads), recv_sizes, send_sizes, group=group)
    cost.bytes_out += sum(send_sizes)
    return list(recv.split(recv_sizes))


def gather(raw, payload: torch.Tensor, codec: ChunkCodec, group, n: int,
           cost: Cost, sizes: list[int] | None = None) -> list[torch.Tensor]:
    """All-gather one payload per rank (one all_gather_into_tensor when sizes are fixed;
    variable ones, whose sizes the host knows already, padded to the largest)."""
    device = payload.device
    if codec.fixed is not None:
        out = torch.empty(n * codec.fixed, dtype=U8, device=device)
        with Timed(cost, "comm_s", device):
            raw.all_gather_into_tensor(out, payload, group=group)
        cost.bytes_out += payload.numel()
        return list(out.split(codec.fixed))
    assert sizes is not None, "a variable-size gather needs every rank's payload size"
    width = max(sizes)
    padded = payload
    if payload.numel() < width:
        padded = torch.zeros(width, dtype=U8, device=device)
        padded[: payload.numel()] = payload
    out = torch.empty(n * width, dtype=U8, device=device)
    with Timed(cost, "comm_s", device):
        raw.all_gather_into_tensor(out, padded, group=group)
    cost.bytes_out += width
    return [out[i * width: i * width + s] for i, s in enumerate(sizes)]


def encode_chunks(codec: ChunkCodec, count: int, load: Callable[[int], torch.Tensor],
                  cost: Cost, sizes: list[int] | None = None,
                  whole: Callable[[], torch.Tensor] | None = None
                  ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """Payloads of `count` equal-length chunks: slots of one buffer when fixed, else a list
    of payloads of the given sizes (read on the host from ChunkCodec.sizes). Timed as one
    block, not per chunk. `whole()`: the chunks end to end, encoded with one codec call where
    the codec allows (ChunkCodec.rows); otherwise chunks are loaded one at a time (so at
    most one chunk of scratch lives at once)."""
    if codec.fixed is not None and whole is not None and codec.rows(count):
        x = whole()
        send = torch.empty(count * codec.fixed, dtype=U8, device=x.device)
        with Timed(cost, "compress_s", x.device):
            codec.encode_rows(x, send)
        return list(send.split(codec.fixed)), send
    first = load(0)
    device = first.device
    if codec.fixed is None:
        assert sizes is not None and len(sizes) == count, "variable payloads need sizes"
        payloads = []
        with Timed(cost, "compress_s", device):
            for i in range(count):
                x, first = (first if i == 0 else load(i)), None
                payloads.append(codec.encode_sized(x, sizes[i]))
        return payloads, None
    send = torch.empty(count * codec.fixed, dtype=U8, device=device)
    payloads: list[torch.Tensor] = []
    with Timed(cost, "compress_s", device):
        for i in range(count):
            x, first = (first if i == 0 else load(i)), None  # one chunk alive at a time
            payloads.append(codec.encode(x, out=send[i * codec.fixed: (i + 1) * codec.fixed]))
    return payloads, send


def size_chunks(codec: ChunkCodec, count: int, load: Callable[[int], torch.Tensor],
                cost: Cost, device: torch.device) -> torch.Tensor:
    """The (count,) device sizes of a variable-size codec's payloads of these chunks."""
    with Timed(cost, "compress_s", device):
        return codec.sizes(count, load)


def sum_decoded(codec: ChunkCodec, payloads: list[torch.Tensor], scratch: torch.Tensor,
                total: torch.Tensor, rows: bool = False) -> None:
    """total += each decoded payload, in order. `rows`: the payloads decoded with one codec
    call where they lie end to end and the codec allows (ChunkCodec.rows), through
    len(payloads) chunks of scratch; else one at a time through `scratch`. A function of its
    own: a loop variable left in the caller would keep the last payload (a view of the whole
    receive buffer) alive past the caller's `del`."""
    whole = joined(payloads) if rows else None
    if whole is not None and codec.rows(len(payloads)):
        count, length = len(payloads), scratch.numel()
        decoded = torch.empty(count * length, dtype=scratch.dtype, device=scratch.device)
        codec.decode_rows(whole, decoded)
        for row in decoded.view(count, length):
            total += row
        return
    for payload in payloads:
        total += codec.decode(payload, scratch)


def decode_each(codec: ChunkCodec, payloads: list[torch.Tensor],
                targets: list[torch.Tensor]) -> None:
    """Decode payload i into targets[i] (a function of its own, as sum_decoded)."""
    for target, payload in zip(targets, payloads, strict=True):
        codec.decode(payload, target)


def size_plans(raw, codecs: list[ChunkCodec], count: int,
                loads: list[Callable[[int], torch.Tensor]], group, n: int, cost: Cost,
                device: torch.device) -> list[SizePlan]:
    """Per segment, the sizes of the `count` payloads this rank sends (chunk i loaded by
    loads[segment](i)) and of those it receives, for every segment in one host read; Nones
    for a fixed-rate codec. One chunk a segment: every rank's payload is gathered; n chunks:
    peer j gets chunk j."""
    if not codecs or codecs[0].fixed is not None:
        return [None] * len(codecs)
    mine = torch.stack([size_chunks(codec, count, load, cost, device)
                        for codec, load in zip(codecs, loads, strict=True)])
    if count == 1:
        theirs = gather_sizes(raw, mine.view(-1), group, n, cost)
    else:
        theirs = exchange_sizes(raw, mine, group, cost)
    own, got = read_sizes(mine, theirs)
    return [(own[s * count: (s + 1) * count], peers)
            for s, peers in enumerate(by_segment(got, len(codecs)))]
