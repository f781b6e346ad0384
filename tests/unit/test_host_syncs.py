"""Host syncs of the variable-size codecs (mpc, topk) in the compressed collectives, counted on
CPU: every call that reads a tensor's value into Python (item, tolist, cpu, bool, int,
float, index, nonzero) waits for the device on CUDA, so it is counted here.

The codecs' device paths run on CPU (FORCE_DEVICE_PATH). One process plays rank 0 of a group
in which every rank holds the same tensor (a loopback raw): the algorithms and their syncs
are those of a real group; only the wire is simulated. A segment must cost the same small
number of syncs whatever the group size, and nothing at all for a fixed-rate codec.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import pytest
import torch

from neoxlab.comm import collectives as cc
from neoxlab.compress import make_compressor, mpc, topk

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
def test_a_segment_costs_a_few_syncs_whatever_the_group_size(device_paths, spec, algorithm):
    small, got = syncs_of_all_reduce(spec, 4, algorithm)
    large, _ = syncs_of_all_reduce(spec, 16, algorithm)
    assert large == small, f"{spec}: {small} syncs with 4 ranks, {large} with 16"
    assert small <= 4 * SEGMENTS
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


def test_batched_encode_sends_non_finite_and_incompressible_messages_raw(device_paths):
    """One sync for the batch, and per message the same choice encode() makes."""
    for spec in ("mpc", "topk:ratio=0.01"):
        c = make_compressor(spec)
        parts = [smooth(4096), torch.randn(4096), smooth(4096)]
        parts[2][7] = float("nan")
        with counting_host_reads() as counts:
            many = c.encode_many(3, parts.__getitem__)
        assert sum(counts.values()) == 1, (spec, dict(counts))
        one = [c.encode(p) for p in parts]
        assert [torch.equal(a, b) for a, b in zip(many, one, strict=True)] == [True] * 3, spec
        decoded = [c.decode_sized(p, (4096,), torch.float32) for p in many]
        assert torch.equal(decoded[2].isnan(), parts[2].isnan())
