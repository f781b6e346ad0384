"""Host syncs of the variable-size codecs (mpc, topk) in the compressed collectives, counted on
CPU: every call that reads a tensor's value into Python (item, tolist, cpu, bool, int,
float, index, nonzero) waits for the device on CUDA, so it is counted here.

The codecs' device paths run on CPU (FORCE_DEVICE_PATH). One process plays rank 0 of a group
in which every rank holds the same tensor (a loopback raw): the algorithms and their syncs
are those of a real group; only the wire is simulated. A call of a variable-size codec costs
one host sync (its size table), whatever the group size and the number of segments; the
all-to-all all-reduce two (its second phase encodes sums that exist only after the first);
a fixed-rate codec none at all.
"""

from __future__ import annotations

import contextlib
from collections import Counter, defaultdict, deque

import pytest
import torch

from neoxlab.comm import collectives as cc
from neoxlab.compress import Compressor, make_compressor, mpc, topk

READS = ("item", "tolist", "cpu", "__bool__", "__int__", "__float__", "__index__", "nonzero")


@contextlib.contextmanager
def counting_host_reads():
    """Count calls that read a tensor's value on the host while active."""
    counts: Counter[str] = Counter()
    patched = {}

    def counted(name, original):
        def run(*args, **kwargs):
            counts[name] += 1
            return original(*args, **kwargs)
        return run

    targets = [(torch.Tensor, m) for m in READS] + [(torch, "nonzero")]
    for owner, name in targets:
        patched[(owner, name)] = getattr(owner, name)
        setattr(owner, name, counted(name, patched[(owner, name)]))
    try:
        yield counts
    finally:
        for (owner, name), original in patched.items():
            setattr(owner, name, original)


class LoopbackRaw:
    """torch.distributed's raw collectives for rank 0 of n ranks that all send what this
    one sends: peer j's slot for rank 0 is its slot 0, i.e. this rank's own slot 0."""

    def __init__(self, n: int):
        self.n = n

    def all_to_all_single(self, out, inp, output_split_sizes=None, input_split_sizes=None,
                          group=None):
        first = inp[: input_split_sizes[0] if input_split_sizes else inp.numel() // self.n]
        out.copy_(first.repeat(self.n))

    def all_gather_into_tensor(self, out, inp, group=None):
        out.copy_(inp.repeat(self.n))

    def broadcast(self, tensor, src, group=None):
        pass  # this rank is the source: its tensor is what every rank gets


class Wire(LoopbackRaw):
    """LoopbackRaw plus point-to-point messages: send() queues a copy under `sender` (the
    rank this process plays while sending), recv(src) takes src's queue in order."""

    def __init__(self, n: int):
        super().__init__(n)
        self.sender = 0
        self.queues: dict[int, deque] = defaultdict(deque)

    def send(self, tensor, dst, group=None):
        self.queues[self.sender].append(tensor.clone())

    def recv(self, tensor, src, group=None):
        tensor.copy_(self.queues[src].popleft())


@pytest.fixture
def device_paths(monkeypatch):
    monkeypatch.setattr(mpc, "FORCE_DEVICE_PATH", True)
    monkeypatch.setattr(topk, "FORCE_DEVICE_PATH", True, raising=False)


def smooth(numel: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return torch.cumsum(torch.randn(numel, generator=g) * 1e-3, 0)  # mpc compresses it


SEGMENTS = 2
NUMEL = 1 << 19  # fp32: 2 MiB, two segments of 1 MiB


def syncs_of_all_reduce(spec: str, n: int, algorithm: str) -> tuple[int, torch.Tensor]:
    x = smooth(NUMEL)
    with counting_host_reads() as counts:
        cc.all_reduce(LoopbackRaw(n), make_compressor(spec), x, None, n,
                      algorithm=algorithm, segment_bytes=NUMEL * 4 // SEGMENTS)
    return sum(counts.values()), x


@pytest.mark.parametrize("spec", ["mpc", "topk:ratio=0.01"])
@pytest.mark.parametrize("algorithm", ["alltoall", "allgather"])
def test_an_all_reduce_costs_the_same_syncs_whatever_the_group_size(device_paths, spec, algorithm):
    small, got = syncs_of_all_reduce(spec, 4, algorithm)
    large, _ = syncs_of_all_reduce(spec, 16, algorithm)
    assert large == small, f"{spec}: {small} syncs with 4 ranks, {large} with 16"
    assert small <= bound(f"all_reduce:{algorithm}")
    if spec == "mpc":  # lossless: rank 0's chunk is the sum of 4 identical copies, exactly
        owned = NUMEL // SEGMENTS // 4  # (the loopback peers send rank 0's own chunks)
        assert torch.equal(got[:owned], smooth(NUMEL)[:owned] * 4)


def test_mpc_decodes_without_reading_headers(device_paths):
    c = make_compressor("mpc")
    x = smooth(5000)
    payload = c.encode(x)
    with counting_host_reads() as counts:
        y = c.decode_sized(payload, (5000,), torch.float32)
    assert sum(counts.values()) == 0 and torch.equal(y, x)


@pytest.mark.parametrize("spec", ["zfp:rate=8,impl=torch", "int8", "fp16"])
def test_fixed_rate_all_reduce_has_no_host_sync(spec):
    x = smooth(NUMEL)
    with counting_host_reads() as counts:
        cc.all_reduce(LoopbackRaw(4), make_compressor(spec), x, None, 4,
                      segment_bytes=NUMEL * 4 // SEGMENTS)
    assert sum(counts.values()) == 0, dict(counts)


def test_sized_encode_is_encode_without_a_sync(device_paths):
    """payload_sizes tells encode()'s sizes without a sync (one read for the batch), and
    encode_sized with them writes encode()'s bytes without one: non-finite, incompressible,
    empty and uncoded messages included."""
    nan = smooth(4096)
    nan[7] = float("nan")
    parts = [smooth(4096), torch.randn(4096), nan, smooth(4099).half(), smooth(333).bfloat16(),
             smooth(4096).double(), torch.empty(0), torch.arange(64), smooth(40)]
    for spec in ("mpc", "topk:ratio=0.01", "topk:k=3"):
        c = make_compressor(spec)
        with counting_host_reads() as counts:
            sizes = c.payload_sizes(len(parts), parts.__getitem__).tolist()
            sized = [c.encode_sized(p, s) for p, s in zip(parts, sizes, strict=True)]
        assert sum(counts.values()) == 1, (spec, dict(counts))
        one = [c.encode(p) for p in parts]
        assert [torch.equal(a, b) for a, b in zip(sized, one, strict=True)] == [True] * 9, spec
        decoded = c.decode_sized(sized[2], (4096,), torch.float32)
        assert torch.equal(decoded.isnan(), nan.isnan())


# ---- one call, several segments: at most one host sync -------------------------------------
CALL_SEGMENTS = 4
CALL_NUMEL = CALL_SEGMENTS * 4096 * 2  # fp32; segments of 2 aligned blocks of 4096 values
CALL_SEG_BYTES = CALL_NUMEL * 4 // CALL_SEGMENTS
OPS = ["all_reduce:alltoall", "all_reduce:allgather", "all_gather", "reduce_scatter",
       "broadcast", "send", "recv", "reduce"]


def one_call(op: str, spec: str, n: int) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(host syncs of one call of op, its input, its result), playing rank 0 of n."""
    c, wire, x = make_compressor(spec), Wire(n), smooth(CALL_NUMEL)
    kw = {"segment_bytes": CALL_SEG_BYTES}
    out = x.clone()
    if op in ("recv", "reduce"):  # the peers' messages first, then the counted receiver
        for peer in range(1, n if op == "reduce" else 2):
            wire.sender = peer
            if op == "recv":
                cc.send(wire, c, x, 0, None, **kw)
            else:
                cc.reduce(wire, c, x.clone(), 0, list(range(n)), peer, None, **kw)
    outs = [torch.empty_like(x) for _ in range(n)]
    calls = {
        "all_reduce:alltoall": lambda: cc.all_reduce(wire, c, out, None, n, **kw),
        "all_reduce:allgather": lambda: cc.all_reduce(wire, c, out, None, n,
                                                      algorithm="allgather", **kw),
        "all_gather": lambda: cc.all_gather_into(wire, c, x, outs, None, n, **kw),
        "reduce_scatter": lambda: cc.reduce_scatter(wire, c, x, out[: CALL_NUMEL // n], None,
                                                    n, **kw),
        "broadcast": lambda: cc.broadcast(wire, c, out, 0, 0, None, **kw),
        "send": lambda: cc.send(wire, c, x, 1, None, **kw),
        "recv": lambda: cc.recv(wire, c, out, 1, None, **kw),
        "reduce": lambda: cc.reduce(wire, c, out, 0, list(range(n)), 0, None, **kw),
    }
    with counting_host_reads() as counts:
        calls[op]()
    return sum(counts.values()), x, torch.cat(outs) if op == "all_gather" else out


def bound(op: str) -> int:
    """Host syncs a call of a variable-size codec may make: one size table per phase whose
    payloads depend on data the host has not seen."""
    return 2 if op == "all_reduce:alltoall" else 1


@pytest.mark.parametrize("spec", ["mpc", "topk:ratio=0.01"])
@pytest.mark.parametrize("op", OPS)
def test_a_variable_size_call_costs_one_sync_whatever_its_segments(device_paths, spec, op):
    syncs, x, got = one_call(op, spec, 4)
    assert syncs <= bound(op), f"{spec} {op}: {syncs} host syncs in one call of " \
                               f"{CALL_SEGMENTS} segments (at most {bound(op)})"
    assert one_call(op, spec, 8)[0] == syncs  # and whatever the group size
    if spec == "mpc":  # lossless: the results are exact
        n = 4
        want = {"all_reduce:allgather": x * n, "reduce": x * n, "broadcast": x, "recv": x,
                "all_gather": x.repeat(n), "reduce_scatter": x[: CALL_NUMEL // n] * n}
        if op in want:
            view = got[: CALL_NUMEL // n] if op == "reduce_scatter" else got
            assert torch.equal(view, want[op]), op


@pytest.mark.parametrize("spec", ["zfp:rate=8,impl=torch", "int8", "fp16"])
@pytest.mark.parametrize("op", OPS)
def test_a_fixed_rate_call_has_no_host_sync(spec, op):
    syncs, _, _ = one_call(op, spec, 4)
    assert syncs == 0, f"{spec} {op}: {syncs} host syncs"


@pytest.mark.parametrize("spec", ["mpc", "topk:ratio=0.01"])
@pytest.mark.parametrize("algorithm", ["alltoall", "allgather"])
def test_error_feedback_all_reduce_syncs(device_paths, spec, algorithm):
    """With error feedback the all-to-all all-reduce reads its second phase's sizes once a
    segment: the residual update needs the segment's input and payloads until its results
    are in, so the phases cannot be split across segments without holding them all."""
    x, residual = smooth(CALL_NUMEL), torch.full((CALL_NUMEL,), 1e-4)
    with counting_host_reads() as counts:
        cc.all_reduce(Wire(4), make_compressor(spec), x, None, 4, residual, algorithm,
                      segment_bytes=CALL_SEG_BYTES)
    assert sum(counts.values()) <= (1 + CALL_SEGMENTS if algorithm == "alltoall" else 1)


@pytest.mark.parametrize("spec", ["mpc", "topk:ratio=0.01"])
def test_sizing_without_syncs_leaves_every_result_as_plain_encode_gives_it(device_paths, spec,
                                                                            monkeypatch):
    """The codecs' sync-free sizing against the base class's (which encodes each message
    to learn its size): every op's result is bit-identical."""
    fast = {op: one_call(op, spec, 4)[2] for op in OPS}
    codec = type(make_compressor(spec))
    monkeypatch.setattr(codec, "payload_sizes", Compressor.payload_sizes)
    monkeypatch.setattr(codec, "encode_sized", Compressor.encode_sized)
    for op in OPS:
        syncs, _, plain = one_call(op, spec, 4)
        assert syncs > bound(op) or op == "recv"  # the plain path ran (recv encodes none)
        assert torch.equal(plain.view(torch.int32), fast[op].view(torch.int32)), op
