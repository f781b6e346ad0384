"""Rank program for the compressed-collectives test (4 ranks, gloo); writes its checks.

Everything runs in strict-device mode: the raw collectives reject any tensor that is not on
its payload's device, and stray allocations (no device named) land on meta.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from neoxlab.comm import collectives as cc
from neoxlab.comm import memprobe, strict
from neoxlab.comm.classify import Classifier, Grid
from neoxlab.comm.patch import CompressionPatch
from neoxlab.comm.scheme import DimCompression
from neoxlab.comm_scratch import scratch_bytes
from neoxlab.compress import make_compressor
from neoxlab.run import dist as neox_dist

CPU = torch.device("cpu")
OPS = ("all_reduce", "all_gather_into_tensor", "all_to_all_single", "broadcast", "send",
       "recv")


def identical_everywhere(t: torch.Tensor, n: int) -> bool:
    """Whether every rank holds bit-identical values of t."""
    everyone = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(everyone, t)
    return all(torch.equal(everyone[0], e) for e in everyone[1:])


def main(out: Path) -> None:
    info = neox_dist.discover()
    dist.init_process_group("gloo")
    me, n = info.rank, info.world_size
    raw = strict.checked(SimpleNamespace(**{op: getattr(dist, op) for op in OPS}))
    g = torch.Generator().manual_seed(100 + me)
    checks: dict[str, object] = {}
    none, mpc, zfp = (make_compressor(s) for s in ("none", "mpc", "zfp:rate=8"))

    def strict_run(fn, *args, **kwargs):
        with strict.payload_device(CPU, strict=True):
            return fn(*args, **kwargs)

    # strict mode itself: a tensor allocated without device= is caught
    try:
        with strict.payload_device(CPU, strict=True):
            raw.all_reduce(torch.ones(4))
        checks["strict_catches_unnamed_device"] = False
    except strict.DeviceMismatchError:
        checks["strict_catches_unnamed_device"] = True

    # integer-valued floats: sums are exact in any order, so results must be bit-identical
    ints = torch.randint(-1000, 1000, (4097,), generator=g).float()
    plain = ints.clone()
    dist.all_reduce(plain)
    for algorithm in ("allgather", "alltoall"):
        for comp in (none, mpc):
            result = ints.clone()
            strict_run(cc.all_reduce, raw, comp, result, None, n, algorithm=algorithm)
            checks[f"all_reduce_{algorithm}_{comp.name}_exact"] = torch.equal(result, plain)
            segmented = ints.clone()  # the same through 1 KiB segments
            strict_run(cc.all_reduce, raw, comp, segmented, None, n, algorithm=algorithm,
                       segment_bytes=1024)
            checks[f"all_reduce_{algorithm}_{comp.name}_segmented_exact"] = torch.equal(
                segmented, plain)

    # what a zfp all-reduce puts on the wire is the same whole or in segments
    x = torch.randn(3072, generator=g)
    for algorithm in ("allgather", "alltoall"):
        whole = strict_run(cc.all_reduce, raw, zfp, x.clone(), None, n, algorithm=algorithm)
        parts = strict_run(cc.all_reduce, raw, zfp, x.clone(), None, n, algorithm=algorithm,
                           segment_bytes=1024)
        checks[f"all_reduce_{algorithm}_zfp_ratio"] = x.numel() * 4 / whole.bytes_out
        checks[f"all_reduce_{algorithm}_zfp_segmented_bytes"] = parts.bytes_out / whole.bytes_out

    x = torch.randn(3000, generator=g)
    gathered = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(gathered, x)
    parts = [torch.empty_like(x) for _ in range(n)]
    strict_run(cc.all_gather_into, raw, mpc, x, parts, None, n)
    checks["all_gather_mpc_exact"] = all(map(torch.equal, parts, gathered))

    src_value = torch.randn(2048, generator=torch.Generator().manual_seed(5))
    target = src_value.clone() if me == 1 else torch.zeros(2048)
    strict_run(cc.broadcast, raw, mpc, target, 1, me, None)
    checks["broadcast_mpc_exact"] = torch.equal(target, src_value)
    lossy = src_value.clone() if me == 1 else torch.zeros(2048)
    strict_run(cc.broadcast, raw, zfp, lossy, 1, me, None)
    checks["lossy_broadcast_identical"] = identical_everywhere(lossy, n)
    checks["lossy_broadcast_source_decoded"] = not torch.equal(lossy, src_value)

    chunks = torch.randint(-50, 50, (n * 1024,), generator=g).float()
    expected = torch.empty(1024)
    dist.reduce_scatter_tensor(expected, chunks.clone())
    result = torch.empty(1024)
    strict_run(cc.reduce_scatter, raw, mpc, chunks, result, None, n)
    checks["reduce_scatter_mpc_exact"] = torch.equal(result, expected)

    if me in (0, 1):
        for comp in (mpc, zfp):
            if me == 0:
                strict_run(cc.send, raw, comp, src_value, 1)
            else:
                got = torch.empty(2048)
                strict_run(cc.recv, raw, comp, got, 0)
                checks[f"send_recv_{comp.name}_close"] = float(
                    (got - src_value).norm() / src_value.norm())

    grad = torch.randn(1 << 16, generator=g)
    exact = grad.clone()
    dist.all_reduce(exact)
    lossy_sum = grad.clone()
    cost = strict_run(cc.all_reduce, raw, zfp, lossy_sum, None, n)
    checks["zfp_rel_error"] = float((lossy_sum - exact).norm() / exact.norm())
    checks["zfp_ratio"] = grad.numel() * 4 / cost.bytes_out
    checks["zfp_all_reduce_identical"] = identical_everywhere(lossy_sum, n)

    # error feedback: the running sum of compressed results tracks the exact running sum
    residual = torch.zeros_like(grad)
    coarse = make_compressor("zfp:rate=2")
    total_fb, total_plain = torch.zeros_like(grad), torch.zeros_like(grad)
    for _ in range(8):
        r = grad.clone()
        strict_run(cc.all_reduce, raw, coarse, r, None, n, residual, "allgather")
        total_fb += r
        r2 = grad.clone()
        strict_run(cc.all_reduce, raw, coarse, r2, None, n, algorithm="allgather")
        total_plain += r2
    truth = exact * 8
    checks["ef_error"] = float((total_fb - truth).norm() / truth.norm())
    checks["no_ef_error"] = float((total_plain - truth).norm() / truth.norm())

    # an fp16 overflow step under error feedback: Inf on one rank reaches every rank (the
    # loss scaler then skips the step); the residual stays finite and unchanged
    half = (grad[:8192] * 0.01).half()
    res16 = torch.zeros_like(half)
    step = half.clone()
    strict_run(cc.all_reduce, raw, zfp, step, None, n, res16)  # a normal step
    before = res16.clone()
    bad = half.clone()
    if me == 1:
        bad[17] = float("inf")
    strict_run(cc.all_reduce, raw, zfp, bad, None, n, res16)
    checks["overflow_reaches_every_rank"] = not bool(torch.isfinite(bad).all())
    checks["overflow_residual_unchanged"] = torch.equal(res16, before)
    after = half.clone()
    strict_run(cc.all_reduce, raw, zfp, after, None, n, res16)
    exact16 = half.float()
    dist.all_reduce(exact16)
    checks["after_overflow_rel_error"] = float((after.float() - exact16).norm()
                                               / exact16.norm())

    # reduce to one rank (ZeRO's per-partition reduce): with lossless mpc the owner gets the
    # fp32 sum in rank order, the others keep their input; with zfp and error feedback, in
    # segments, the owner's sum is what the ranks meant to send (x - new residual)
    part = torch.randn(3000, generator=g)
    everyone = [torch.empty_like(part) for _ in range(n)]
    dist.all_gather(everyone, part)
    want = torch.zeros_like(part)
    for e in everyone:
        want += e
    got = part.clone()
    strict_run(cc.reduce, raw, mpc, got, 1, list(range(n)), me, None)
    checks["reduce_mpc_exact"] = torch.equal(got, want if me == 1 else part)
    got, res = part.clone(), torch.zeros_like(part)
    cost = strict_run(cc.reduce, raw, zfp, got, 3, list(range(n)), me, None, res,
                      segment_bytes=4000)
    sent = part - res
    dist.all_gather(everyone, sent)
    checks["reduce_zfp_is_the_sum_of_what_was_sent"] = (
        me != 3 or torch.allclose(got, torch.stack(everyone).sum(0), atol=1e-5))
    checks["reduce_zfp_residual_nonzero"] = bool(res.abs().max() > 0)
    checks["reduce_zfp_ratio"] = part.numel() * 4 / cost.bytes_out

    # through the patch: an async TP all-reduce is compressed and its Work waits; the
    # cross-entropy [s, b] statistics stay exact; reduce is compressed
    policy = DimCompression(make_compressor("zfp:rate=8"), 0, False)
    patch = CompressionPatch({"tp": policy}, Classifier(Grid(tp=n, pp=1, dp=1), hidden_size=64),
                             strict=True).install()
    try:
        act = torch.randn(32, 64, generator=g)
        work = dist.all_reduce(act, async_op=True)
        checks["async_work_waits"] = bool(work.wait()) and work.is_completed()
        stats = patch.accountant.stats
        checks["async_tp_compressed"] = stats[("tp", "all_reduce")].compressed_calls
        checks["async_tp_identical"] = identical_everywhere(act, n)
        logits = torch.randn(16, 32, generator=g)  # [s, b] fp32
        exact_logits = logits.clone()
        patch.raw.all_reduce(exact_logits)
        dist.all_reduce(logits)
        checks["cross_entropy_exact"] = torch.equal(logits, exact_logits)
        checks["cross_entropy_compressed_calls"] = stats[("other", "all_reduce")].compressed_calls
        red = torch.randn(32, 64, generator=g)
        before = red.clone()
        dist.reduce(red, dst=2)
        checks["reduce_compressed"] = stats[("tp", "reduce")].compressed_calls
        checks["reduce_only_dst_changes"] = (me == 2) != torch.equal(red, before)
    finally:
        patch.uninstall()

    # peak extra memory of a compressed all-reduce of 256 MiB (fp32, fp16 payloads)
    big = torch.randn(64 << 20, generator=g)
    big.mul_(1.0)  # resident before measuring
    fp16 = make_compressor("fp16")
    dist.barrier()
    _, peak = memprobe.peak_extra_bytes(
        lambda: cc.all_reduce(raw, fp16, big, None, n, algorithm="alltoall"))
    checks["peak_extra_over_message"] = peak / (big.numel() * 4)
    checks["peak_extra_within_estimate"] = peak <= scratch_bytes(big.numel() * 4)
    mid = big[: 16 << 20]  # 64 MiB through the all-gather algorithm (small groups' choice)
    dist.barrier()
    _, peak = memprobe.peak_extra_bytes(
        lambda: cc.all_reduce(raw, fp16, mid, None, n, algorithm="allgather"))
    checks["peak_extra_over_message_allgather"] = peak / (mid.numel() * 4)
    (out / f"rank{me}.json").write_text(json.dumps(checks))
    dist.barrier()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
