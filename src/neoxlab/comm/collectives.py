"""Compressed collectives over torch.distributed (gloo, NCCL, or any registered backend).

Each function takes the *original* torch.distributed functions (`raw`) so it never re-enters
the patch, writes its result in place and returns the cost for accounting. Designs:

- all-reduce ("alltoall", after DeepSpeed ZeRO++'s all_to_all_quant_reduce): the message is
  cut into n equal chunks, one all-to-all of their payloads, a local fp32 sum of the chunk
  this rank owns, then one all_gather_into_tensor of the re-encoded sums. Every rank, the
  owner included, decodes the same payloads, so all ranks end bit-identical.
- all-reduce ("allgather", small groups): one all-gather of whole payloads, local sum.
- all-gather: one compressed all_gather_into_tensor per segment; broadcast: one payload per
  segment, decoded by the source too (replicas stay identical); send/recv: one payload per
  segment; reduce (ZeRO's per-partition reduce to its owner): one payload per rank to the
  destination, which alone decodes.
- Every op goes in segments (a quarter of the message, 1-64 MiB: neoxlab.comm_scratch), so
  its extra memory is a bounded fraction of the message (comm_scratch.op_scratch_bytes).
- Fixed-size payloads (neoxlab.comm.payload) need no size exchange and no host sync.
  Variable ones (mpc, topk) are sized on the device for the whole call first; one fixed-size
  collective exchanges that size table (on the payload's device: an NCCL group serves CUDA
  tensors only) and the host reads it once (read_sizes). That is the call's one host sync;
  the all-to-all all-reduce makes a second, as its second phase encodes sums that exist only
  after the first phase's exchange.
- No torch.cuda.synchronize(): CUDA work is timed with events, folded into the accounting
  once they have completed (neoxlab.comm.accounting).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from neoxlab.comm.payload import ChunkCodec
from neoxlab.comm_scratch import SEGMENT_BYTES, segment_bytes_for
from neoxlab.compress import Compressor

U8 = torch.uint8


@dataclass
class Cost:
    bytes_out: int = 0
    compress_s: float = 0.0
    decompress_s: float = 0.0
    comm_s: float = 0.0
    events: list = field(default_factory=list)  # (attr, start, end) CUDA events, unresolved
    spans: list = field(default_factory=list)  # (attr, wall-clock start, seconds): host-timed

    def ready(self) -> bool:
        """Whether every timed block's end event has completed (a query: never waits)."""
        return all(end.query() for _, _, end in self.events)

    def resolve(self) -> Cost:
        """Fold the CUDA event pairs into the seconds (waits for those not yet done)."""
        for attr, start, end in self.events:
            end.synchronize()
            setattr(self, attr, getattr(self, attr) + start.elapsed_time(end) / 1e3)
        self.events.clear()
        return self


class Timed:
    """Adds the duration of its block to cost.<attr>: host clock for CPU work, CUDA events
    (no synchronization) for work queued on a GPU. Host-timed blocks also keep their
    wall-clock start (cost.spans), so the ranks' codec and wire phases can be lined up
    across processes (studies/codec_overlap.py)."""

    def __init__(self, cost: Cost, attr: str, device: torch.device):
        self.cost, self.attr, self.cuda = cost, attr, device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.wall = time.time()
            self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.cost.events.append((self.attr, self.start, end))
        else:
            took = time.perf_counter() - self.t0
            setattr(self.cost, self.attr, getattr(self.cost, self.attr) + took)
            self.cost.spans.append((self.attr, self.wall, took))


# ---- payload exchange -------------------------------------------------------------------
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
                  cost: Cost, sizes: list[int] | None = None
                  ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """Payloads of `count` equal-length chunks, loaded one at a time (so at most one chunk
    of scratch lives at once): slots of one buffer when fixed, else a list of payloads of
    the given sizes (read on the host from ChunkCodec.sizes)."""
    if codec.fixed is None:
        assert sizes is not None and len(sizes) == count, "variable payloads need sizes"
        payloads = []
        for i in range(count):
            x = load(i)
            with Timed(cost, "compress_s", x.device):
                payloads.append(codec.encode_sized(x, sizes[i]))
        return payloads, None
    send = None
    payloads: list[torch.Tensor] = []
    for i in range(count):
        x = load(i)
        with Timed(cost, "compress_s", x.device):
            if send is None:
                send = torch.empty(count * codec.fixed, dtype=U8, device=x.device)
            payloads.append(codec.encode(x, out=send[i * codec.fixed: (i + 1) * codec.fixed]))
    return payloads, send


def size_chunks(codec: ChunkCodec, count: int, load: Callable[[int], torch.Tensor],
                cost: Cost, device: torch.device) -> torch.Tensor:
    """The (count,) device sizes of a variable-size codec's payloads of these chunks."""
    with Timed(cost, "compress_s", device):
        return codec.sizes(count, load)


def sum_decoded(codec: ChunkCodec, payloads: list[torch.Tensor], scratch: torch.Tensor,
                total: torch.Tensor) -> None:
    """total += each decoded payload, in order. A function of its own: a loop variable
    left in the caller would keep the last payload (a view of the whole receive buffer)
    alive past the caller's `del`."""
    for payload in payloads:
        total += codec.decode(payload, scratch)


def decode_each(codec: ChunkCodec, payloads: list[torch.Tensor],
                targets: list[torch.Tensor]) -> None:
    """Decode payload i into targets[i] (a function of its own, as sum_decoded)."""
    for target, payload in zip(targets, payloads, strict=True):
        codec.decode(payload, target)


# ---- chunk views ------------------------------------------------------------------------
class Chunks:
    """A flat segment as n chunks of equal length (the last one zero-padded in scratch),
    each optionally plus its error-feedback residual."""

    def __init__(self, flat: torch.Tensor, n: int, residual: torch.Tensor | None):
        self.flat, self.n, self.residual = flat, n, residual
        self.length = max(1, -(-flat.numel() // n))

    def bounds(self, i: int) -> tuple[int, int]:
        lo = min(i * self.length, self.flat.numel())
        return lo, min(lo + self.length, self.flat.numel())

    def full(self, i: int) -> bool:
        lo, hi = self.bounds(i)
        return hi - lo == self.length

    def load(self, i: int) -> torch.Tensor:
        """Chunk i as a chunk-length tensor: a view when possible, else a padded copy."""
        lo, hi = self.bounds(i)
        if self.residual is None and self.full(i):
            return self.flat[lo:hi]
        buf = torch.zeros(self.length, dtype=self.flat.dtype, device=self.flat.device)
        buf[: hi - lo] = self.flat[lo:hi]
        if self.residual is not None:
            buf[: hi - lo] += self.residual[lo:hi]
        return buf

    def store(self, i: int, decode: Callable[[torch.Tensor], torch.Tensor],
              scratch: torch.Tensor) -> None:
        """Write chunk i from a decoder (straight into place when the chunk is full)."""
        lo, hi = self.bounds(i)
        if self.full(i):
            decode(self.flat[lo:hi])
        elif hi > lo:
            self.flat[lo:hi] = decode(scratch)[: hi - lo]


def all_finite(t: torch.Tensor) -> torch.Tensor:
    """Whether t holds no NaN/Inf, as a device scalar (no sync), from its min and max
    (which NaN and Inf reach): no temporary of t's size, as isfinite's would be."""
    lo, hi = torch.aminmax(t)
    return torch.isfinite(lo) & torch.isfinite(hi)


def settle_residual(chunks: Chunks, codec: ChunkCodec, sent: list[torch.Tensor],
                    results: list[torch.Tensor], scratch: torch.Tensor, cost: Cost,
                    finite: torch.Tensor | None = None) -> None:
    """Error feedback once the sums are known: residual_i = (x_i + residual_i) minus what
    payload i carried, unless any result holds NaN/Inf. An fp16 overflow on any rank reaches
    every rank's result (payloads mark non-finite values), the loss scaler skips that step,
    and so the residual stays as it was, finite. The check is a device scalar: no sync.
    `finite`: that check made already by the caller (results are then not decoded)."""
    device = scratch.device
    with Timed(cost, "decompress_s", device):
        if finite is None:
            finite = torch.ones((), dtype=torch.bool, device=device)
            for payload in results:
                finite &= all_finite(codec.decode(payload, scratch))
        for i, payload in enumerate(sent):
            lo, hi = chunks.bounds(i)
            if hi == lo:
                continue
            meant = chunks.load(i)  # a fresh buffer: x_i + residual_i
            meant -= codec.decode(payload, scratch)
            old = chunks.residual[lo:hi]
            torch.where(finite, meant[: hi - lo], old, out=old)  # in place: no third copy


# ---- all-reduce ---------------------------------------------------------------------------
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
    plans = _size_plans(raw, codecs, per, [chunks.load for chunks in parts], group, n, cost,
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


SizePlan = tuple[list[int], list[int]] | None  # (this rank's sizes, the peers'), or fixed


def _size_plans(raw, codecs: list[ChunkCodec], count: int,
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
    payloads, send = encode_chunks(codec, n, chunks.load, cost, own)
    received = exchange(raw, payloads, send, codec, group, cost, peers)
    scratch = torch.empty(chunks.length, dtype=dtype, device=device)
    total = torch.zeros(chunks.length, dtype=torch.float32, device=device)
    with Timed(cost, "decompress_s", device):
        sum_decoded(codec, received, scratch, total)
    del received, scratch
    if out is not None:
        return payloads, send, out.copy_(total)
    return payloads, send, total if dtype == torch.float32 else total.to(dtype)


def _store_gathered(codec: ChunkCodec, chunks: Chunks, gathered: list[torch.Tensor],
                    cost: Cost) -> None:
    """Decode every owner's payload into its chunk of the segment."""
    scratch = torch.empty(chunks.length, dtype=chunks.flat.dtype, device=chunks.flat.device)
    with Timed(cost, "decompress_s", chunks.flat.device):
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
    second = _size_plans(raw, codecs, 1, loads, group, n, cost, device)
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


# ---- other collectives ------------------------------------------------------------------
# Whole-message collectives go in segments too (as all-reduce), so that their payloads and
# scratch stay a bounded fraction of the message. Segment bounds fall on multiples of
# SEGMENT_ALIGN values, so that the blocks of fixed-rate codecs (ZFP's 16 values, int8/int4
# blocks dividing 4096) are the whole message's blocks and the values do not change.
SEGMENT_ALIGN = 4096


def segments(numel: int, itemsize: int, segment_bytes: int = SEGMENT_BYTES
             ) -> list[tuple[int, int]]:
    """[lo, hi) element ranges of a message of numel values of itemsize bytes (one empty
    range for an empty message: the collective still runs on every rank)."""
    step = segment_bytes_for(numel * itemsize, segment_bytes) // max(itemsize, 1)
    step = max(SEGMENT_ALIGN, step - step % SEGMENT_ALIGN)
    return [(lo, min(lo + step, numel)) for lo in range(0, numel, step)] or [(0, 0)]


def _flat_targets(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """A flat view of each tensor, or a flat buffer for one that is not contiguous."""
    return [t.view(-1) if t.is_contiguous() else torch.empty(
        t.numel(), dtype=t.dtype, device=t.device) for t in tensors]


def _copy_back(tensors: list[torch.Tensor], flats: list[torch.Tensor]) -> None:
    for t, flat in zip(tensors, flats, strict=True):
        if flat.data_ptr() != t.data_ptr() or not t.is_contiguous():
            t.copy_(flat.view_as(t))


def all_gather_into(raw, c: Compressor, x: torch.Tensor, outputs: list[torch.Tensor], group,
                    n: int, segment_bytes: int = SEGMENT_BYTES) -> Cost:
    """Compressed all-gather: outputs[i] = decoded payload of rank i (own one included),
    segment by segment."""
    cost = Cost()
    flat = x.contiguous().view(-1)
    targets = _flat_targets(outputs)
    bounds = segments(flat.numel(), x.element_size(), segment_bytes)
    loads = [lambda i, lo=lo, hi=hi: flat[lo:hi] for lo, hi in bounds]
    codecs = [ChunkCodec(c, hi - lo, x.dtype) for lo, hi in bounds]
    plans = _size_plans(raw, codecs, 1, loads, group, n, cost, x.device)
    for (lo, hi), load, codec, plan in zip(bounds, loads, codecs, plans, strict=True):
        own, every = plan if plan is not None else (None, None)
        payloads, send = encode_chunks(codec, 1, load, cost, own)
        gathered = gather(raw, payloads[0], codec, group, n, cost, every)
        del payloads, send
        with Timed(cost, "decompress_s", x.device):
            decode_each(codec, gathered, [t[lo:hi] for t in targets])
        del gathered
    _copy_back(outputs, targets)
    return cost


def reduce_scatter(raw, c: Compressor, x: torch.Tensor, out: torch.Tensor, group,
                   n: int, segment_bytes: int = SEGMENT_BYTES) -> Cost:
    """x holds n equal chunks; out = the fp32 sum of everyone's chunk of this rank. In
    segments: the same slice of every chunk at a time."""
    cost = Cost()
    parts = x.contiguous().view(n, -1)
    (target,) = _flat_targets([out])
    bounds = segments(parts.shape[1], x.element_size() * n, segment_bytes)
    codecs = [ChunkCodec(c, hi - lo, x.dtype) for lo, hi in bounds]
    loads = [lambda i, lo=lo, hi=hi: parts[i, lo:hi] for lo, hi in bounds]
    plans = _size_plans(raw, codecs, n, loads, group, n, cost, x.device)
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
    _copy_back([out], [target])
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
    (flat,) = _flat_targets([x])
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
    _copy_back([x], [flat])
    return cost


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
