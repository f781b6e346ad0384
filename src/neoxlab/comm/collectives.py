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
- Fixed-size payloads (neoxlab.comm.payload) need no size exchange; variable ones exchange
  sizes in tensors on the payload's device (an NCCL group serves CUDA tensors only).
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
def _sizes_tensor(sizes: list[int], device: torch.device) -> torch.Tensor:
    """Host-known sizes on the payload's device, copied without waiting for the device
    (pinned host memory for CUDA)."""
    host = torch.tensor(sizes, dtype=torch.int64, device="cpu")
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def exchange(raw, payloads: list[torch.Tensor], send: torch.Tensor | None, codec: ChunkCodec,
             group, cost: Cost) -> list[torch.Tensor]:
    """All-to-all: payloads[i] goes to peer i; returns what each peer sent here. Fixed
    payloads travel as one buffer of equal slots; variable ones after a size exchange."""
    n, device = len(payloads), payloads[0].device
    if codec.fixed is not None:
        recv = torch.empty(n * codec.fixed, dtype=U8, device=device)
        with Timed(cost, "comm_s", device):
            raw.all_to_all_single(recv, send, group=group)
        cost.bytes_out += send.numel()
        return list(recv.split(codec.fixed))
    send_sizes = [p.numel() for p in payloads]
    recv_sizes = torch.empty(n, dtype=torch.int64, device=device)
    with Timed(cost, "comm_s", device):
        raw.all_to_all_single(recv_sizes, _sizes_tensor(send_sizes, device), group=group)
    recv_list = recv_sizes.tolist()  # sizes are data-dependent: the host must know them
    recv = torch.empty(sum(recv_list), dtype=U8, device=device)
    with Timed(cost, "comm_s", device):
        raw.all_to_all_single(recv, torch.cat(payloads), recv_list, send_sizes, group=group)
    cost.bytes_out += sum(send_sizes)
    return list(recv.split(recv_list))


def gather(raw, payload: torch.Tensor, codec: ChunkCodec, group, n: int,
           cost: Cost) -> list[torch.Tensor]:
    """All-gather one payload per rank (one all_gather_into_tensor when sizes are fixed;
    variable ones are padded to the largest after a size exchange on the device)."""
    device = payload.device
    if codec.fixed is not None:
        out = torch.empty(n * codec.fixed, dtype=U8, device=device)
        with Timed(cost, "comm_s", device):
            raw.all_gather_into_tensor(out, payload, group=group)
        cost.bytes_out += payload.numel()
        return list(out.split(codec.fixed))
    sizes_out = torch.empty(n, dtype=torch.int64, device=device)
    with Timed(cost, "comm_s", device):
        raw.all_gather_into_tensor(sizes_out, _sizes_tensor([payload.numel()], device),
                                   group=group)
    sizes = sizes_out.tolist()
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
                  cost: Cost) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """Payloads of `count` equal-length chunks, loaded one at a time (so at most one chunk
    of scratch lives at once): slots of one buffer when fixed, else a list (a variable-size
    codec reads the sizes of all of them in one host sync)."""
    if codec.fixed is None:
        if not count:
            return [], None
        first = load(0)
        with Timed(cost, "compress_s", first.device):
            return codec.encode_many(count, lambda i: first if i == 0 else load(i)), None
    send = None
    payloads: list[torch.Tensor] = []
    for i in range(count):
        x = load(i)
        with Timed(cost, "compress_s", x.device):
            if send is None:
                send = torch.empty(count * codec.fixed, dtype=U8, device=x.device)
            payloads.append(codec.encode(x, out=send[i * codec.fixed: (i + 1) * codec.fixed]))
    return payloads, send


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
    segment = _reduce_alltoall if algorithm == "alltoall" else _reduce_allgather
    for lo in range(0, flat.numel(), step):
        hi = min(lo + step, flat.numel())
        segment(raw, c, flat[lo:hi], None if res is None else res[lo:hi], group, n, cost)
    if work is not x:
        x.copy_(work)
    return cost


def _reduce_alltoall(raw, c: Compressor, flat: torch.Tensor, res: torch.Tensor | None,
                     group, n: int, cost: Cost) -> None:
    chunks = Chunks(flat, n, res)
    codec = ChunkCodec(c, chunks.length, flat.dtype)
    device, dtype = flat.device, flat.dtype
    scratch = torch.empty(chunks.length, dtype=dtype, device=device)
    earlier = cost.bytes_out  # the message's segments before this one
    payloads, send = encode_chunks(codec, n, chunks.load, cost)
    received = exchange(raw, payloads, send, codec, group, cost)
    if res is None:
        del payloads, send
    phase1 = cost.bytes_out - earlier
    total = torch.zeros(chunks.length, dtype=torch.float32, device=device)
    with Timed(cost, "decompress_s", device):
        sum_decoded(codec, received, scratch, total)  # rank order: a deterministic sum
    del received
    reduced = total if dtype == torch.float32 else total.to(dtype)
    del total
    with Timed(cost, "compress_s", device):
        mine = codec.encode(reduced, out=None if codec.fixed is None else
                            torch.empty(codec.fixed, dtype=U8, device=device))
    del reduced
    gathered = gather(raw, mine, codec, group, n, cost)
    # on the wire: the all-to-all (one message's worth) plus one payload to n-1 peers,
    # reported as the per-message average of the two phases
    phase2 = cost.bytes_out - earlier - phase1
    cost.bytes_out = earlier + (phase1 + phase2 * n) // 2
    if res is not None:
        settle_residual(chunks, codec, payloads, gathered, scratch, cost)
        del payloads, send
    with Timed(cost, "decompress_s", device):
        for i, payload in enumerate(gathered):
            chunks.store(i, lambda out, p=payload: codec.decode(p, out), scratch)


def _reduce_allgather(raw, c: Compressor, flat: torch.Tensor, res: torch.Tensor | None,
                      group, n: int, cost: Cost) -> None:
    device, dtype = flat.device, flat.dtype
    whole = Chunks(flat, 1, res)
    codec = ChunkCodec(c, flat.numel(), dtype)
    scratch = torch.empty_like(flat)
    payloads, send = encode_chunks(codec, 1, whole.load, cost)
    gathered = gather(raw, payloads[0], codec, group, n, cost)
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
    the decoded payloads in fp32 in rank order (`ranks`: the group's global ranks)."""
    cost = Cost()
    work = x if x.is_contiguous() else x.contiguous()
    flat = work.view(-1)
    res = residual.view(-1) if residual is not None else None
    step = max(1, segment_bytes_for(x.numel() * x.element_size(), segment_bytes)
               // x.element_size())
    for lo in range(0, flat.numel(), step):
        hi = min(lo + step, flat.numel())
        _reduce_to(raw, c, flat[lo:hi], None if res is None else res[lo:hi], dst, ranks, me,
                   group, cost)
    if work is not x and me == dst:
        x.copy_(work)
    return cost


def _reduce_to(raw, c: Compressor, flat: torch.Tensor, res: torch.Tensor | None, dst: int,
               ranks: list[int], me: int, group, cost: Cost) -> None:
    device = flat.device
    whole = Chunks(flat, 1, res)
    codec = ChunkCodec(c, flat.numel(), flat.dtype)
    sent, _ = encode_chunks(codec, 1, whole.load, cost)
    cost.bytes_out += sent[0].numel()  # the message's size on the wire, as for all ranks
    scratch = torch.empty_like(flat)
    if me != dst:
        _send_payload(raw, codec, sent[0], dst, group, cost)
        if res is not None:  # error feedback sees this rank's own payload only
            settle_residual(whole, codec, sent, sent, scratch, cost)
        return
    received = [sent[0] if r == me else _recv_payload(raw, codec, r, group, cost, device)
                for r in ranks]
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
    for lo, hi in segments(flat.numel(), x.element_size(), segment_bytes):
        codec = ChunkCodec(c, hi - lo, x.dtype)
        payloads, send = encode_chunks(codec, 1, lambda i, lo=lo, hi=hi: flat[lo:hi], cost)
        gathered = gather(raw, payloads[0], codec, group, n, cost)
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
    for lo, hi in segments(parts.shape[1], x.element_size() * n, segment_bytes):
        codec = ChunkCodec(c, hi - lo, x.dtype)
        payloads, send = encode_chunks(codec, n, lambda i, lo=lo, hi=hi: parts[i, lo:hi], cost)
        received = exchange(raw, payloads, send, codec, group, cost)
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
    decoded values."""
    cost = Cost()
    device = x.device
    flat = x.contiguous().view(-1)
    for lo, hi in segments(flat.numel(), x.element_size(), segment_bytes):
        codec = ChunkCodec(c, hi - lo, x.dtype)
        if me == src:
            payload = encode_chunks(codec, 1, lambda i, lo=lo, hi=hi: flat[lo:hi], cost)[0][0]
        if codec.fixed is not None:
            if me != src:
                payload = torch.empty(codec.fixed, dtype=U8, device=device)
        else:
            size = _sizes_tensor([payload.numel() if me == src else 0], device)
            with Timed(cost, "comm_s", device):
                raw.broadcast(size, src, group=group)
            if me != src:
                payload = torch.empty(int(size.item()), dtype=U8, device=device)
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
    """One payload per segment (a variable size goes first); the receiver cuts the same
    segments from the same numel."""
    cost = Cost()
    flat = x.contiguous().view(-1)
    for lo, hi in segments(flat.numel(), x.element_size(), segment_bytes):
        codec = ChunkCodec(c, hi - lo, x.dtype)
        payloads, buf = encode_chunks(codec, 1, lambda i, lo=lo, hi=hi: flat[lo:hi], cost)
        _send_payload(raw, codec, payloads[0], dst, group, cost)
        cost.bytes_out += payloads[0].numel()
        del payloads, buf
    return cost


def recv(raw, c: Compressor, x: torch.Tensor, src: int, group=None,
         segment_bytes: int = SEGMENT_BYTES) -> Cost:
    """Receive the payloads of `src`'s segments and decode them into x."""
    cost = Cost()
    device = x.device
    (flat,) = _flat_targets([x])
    for lo, hi in segments(flat.numel(), x.element_size(), segment_bytes):
        codec = ChunkCodec(c, hi - lo, x.dtype)
        payload = _recv_payload(raw, codec, src, group, cost, device)
        cost.bytes_out += payload.numel()
        with Timed(cost, "decompress_s", device):
            codec.decode(payload, flat[lo:hi])
        del payload
    _copy_back([x], [flat])
    return cost


def _send_payload(raw, codec: ChunkCodec, payload: torch.Tensor, dst: int, group,
                  cost: Cost) -> None:
    with Timed(cost, "comm_s", payload.device):
        if codec.fixed is None:
            raw.send(_sizes_tensor([payload.numel()], payload.device), dst, group=group)
        raw.send(payload, dst, group=group)


def _recv_payload(raw, codec: ChunkCodec, src: int, group, cost: Cost,
                  device: torch.device) -> torch.Tensor:
    with Timed(cost, "comm_s", device):
        if codec.fixed is None:
            size = torch.empty(1, dtype=torch.int64, device=device)
            raw.recv(size, src, group=group)
            nbytes = int(size.item())  # data-dependent: the host must know it
        else:
            nbytes = codec.fixed
        payload = torch.empty(nbytes, dtype=U8, device=device)
        raw.recv(payload, src, group=group)
    return payload
