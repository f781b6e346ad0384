"""Per-call, not per-chunk, work in the compressed all-reduce: at DP=64 a segment's 64 equal
chunks are encoded with one codec call and decoded with one, and timed as one block per
phase, so codec launches and CUDA timing events do not grow with the group.

Timed blocks are counted as the host-timed spans of a CPU run: on CUDA the same Timed block
records one event pair instead of one span (comm/collectives/cost.py), so events per call
are twice the spans. Codec calls are the compressor's own counters (encode_fixed calls,
decode_fixed calls). One process plays rank 0 of a group whose peers send what it sends
(the loopback of tests/unit/test_host_syncs.py)."""

from __future__ import annotations

import pytest
import torch

from neoxlab.comm import collectives as cc
from neoxlab.compress import make_compressor
from tests.unit.test_host_syncs import LoopbackRaw

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NUMEL = 64 * 768  # fp32, 192 KiB: one segment; chunks of 768 values (3 int8 blocks, 48 ZFP)


def reduce_once(spec: str, n: int, error_feedback: bool, per_chunk: bool = False):
    c = make_compressor(spec)
    if per_chunk:  # the codec's payload layout withheld: one call per chunk, as before
        c.fixed_regions = lambda dtype: None
    g = torch.Generator().manual_seed(5)
    x = torch.randn(NUMEL, generator=g)
    res = torch.randn(NUMEL, generator=g) * 1e-3 if error_feedback else None
    cost = cc.all_reduce(LoopbackRaw(n), c, x, None, n, res, "alltoall")
    return cost, c.stats, x, res


@pytest.mark.parametrize("spec", ["zfp:rate=8", "int8", "int4", "fp8", "fp16", "none"])
@pytest.mark.parametrize("error_feedback", [False, True])
def test_a_dp64_all_reduce_makes_a_few_codec_calls_and_timed_blocks(spec, error_feedback):
    cost, stats, _, _ = reduce_once(spec, 64, error_feedback)
    # encode the 64 chunks, decode the 64 received, encode the owned sum, decode the 64
    # gathered sums; with error feedback also decode the sent payloads and the results
    assert stats.calls == 2
    assert stats.decodes <= (4 if error_feedback else 2)
    # timed: encode, all-to-all, decode-sum, encode, all-gather, store (+ residual)
    assert len(cost.spans) <= (7 if error_feedback else 6)


@pytest.mark.parametrize("spec", ["zfp:rate=8", "int8", "int4", "fp8", "fp16"])
def test_the_counts_do_not_grow_with_the_group(spec):
    small, large = reduce_once(spec, 8, True), reduce_once(spec, 64, True)
    assert len(small[0].spans) == len(large[0].spans)
    assert (small[1].calls, small[1].decodes) == (large[1].calls, large[1].decodes)


@pytest.mark.parametrize("spec", ["zfp:rate=8", "int8", "int4", "fp8", "fp16"])
@pytest.mark.parametrize("error_feedback", [False, True])
def test_one_call_gives_the_bytes_of_one_call_per_chunk(spec, error_feedback):
    """The payload of the chunks end to end is the chunks' payloads end to end: the sums and
    the residuals are bit-identical to the per-chunk path's."""
    _, batched, x1, r1 = reduce_once(spec, 64, error_feedback)
    _, looped, x2, r2 = reduce_once(spec, 64, error_feedback, per_chunk=True)
    assert looped.calls > 64  # the reference really went chunk by chunk
    assert torch.equal(x1, x2)
    if error_feedback:
        assert torch.equal(r1, r2)


def test_a_padded_last_chunk_goes_chunk_by_chunk_and_stays_exact():
    """Chunks that do not hold whole ZFP blocks cannot share a call: same results as per
    chunk."""
    c = make_compressor("zfp:rate=8")
    x = torch.randn(64 * 37 + 5)
    y = x.clone()
    cc.all_reduce(LoopbackRaw(64), c, x, None, 64)
    c2 = make_compressor("zfp:rate=8")
    c2.fixed_regions = lambda dtype: None
    cc.all_reduce(LoopbackRaw(64), c2, y, None, 64)
    assert torch.equal(x, y)
