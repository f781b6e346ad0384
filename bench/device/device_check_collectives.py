"""One-GPU check of the compressed collectives on NCCL (section 3 of bench/device/device_check.sh;
`--device cpu`: a dry run on gloo).

One GPU allows one NCCL rank, so this cannot show a multi-rank exchange; it shows what a
CPU machine cannot: every tensor the compressed path hands to an NCCL group is a CUDA tensor
(NCCL raises on any other), in strict-device mode, for every op and for fixed-size (zfp, int8,
fp16) and data-dependent (mpc) codecs, and it times the codec and communication phases with
CUDA events against the plain collective. Then the whole training path in this one NCCL
process: torch.distributed.all_reduce through CompressionPatch (strict-device mode, the side
stream, async_op), the patch seeing a two-rank DP group whose peer sends what this rank
sends, every payload moved by a real call on the NCCL group. Last, the overlap the side
stream buys: a compressed all-reduce beside matmuls on the caller's stream, against both on
one stream, asserted against OVERLAP_GOAL.
"""

from __future__ import annotations

import argparse
import functools
from types import SimpleNamespace

import torch
import torch.distributed as dist

from neoxlab.comm import collectives as cc
from neoxlab.comm import patch as patch_module
from neoxlab.comm import strict
from neoxlab.comm.classify import Classifier, Grid
from neoxlab.comm.patch import CompressionPatch
from neoxlab.comm.scheme import DimCompression
from neoxlab.comm.side_stream import SideStreams, StreamWork
from neoxlab.compress import make_compressor
from neoxlab.run.dist import free_port

OPS = ("all_reduce", "all_gather_into_tensor", "all_to_all_single", "broadcast")
# the side stream must hide at least this share of the shorter of the two (the compressed
# all-reduce alone, the matmuls alone): (one stream - side stream) / min(all-reduce, matmuls)
OVERLAP_GOAL = 0.2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of this script on gloo")
    dev = torch.device(ap.parse_args().device)
    port = free_port()
    if dev.type == "cuda":
        torch.cuda.set_device(0)
        dev = torch.device("cuda", 0)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=0, world_size=1,
                            init_method=f"tcp://127.0.0.1:{port}")
    raw = strict.checked(SimpleNamespace(**{op: getattr(dist, op) for op in OPS}))
    x = torch.randn((16 << 20) if dev.type == "cuda" else (1 << 18), device=dev)  # 64 MiB
    if dev.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dist.all_reduce(x.clone())
        end.record()
        end.synchronize()
        print(f"plain all_reduce 64 MiB: {start.elapsed_time(end):.2f} ms")
    zfp = "zfp:rate=8" if dev.type == "cuda" else "zfp:rate=8,impl=torch"
    for spec in ("fp16", "int8", zfp, "mpc"):
        c = make_compressor(spec)
        for algorithm in ("alltoall", "allgather"):
            y = x.clone()
            with strict.payload_device(dev, strict=True):
                cost = cc.all_reduce(raw, c, y, None, 1, torch.zeros_like(y), algorithm)
            cost.resolve()
            err = float((y - x).norm() / x.norm())
            assert torch.isfinite(y).all() and err < 0.1, (spec, algorithm, err)
            print(f"{spec:<12}{algorithm:<10} rel.err {err:.2e}  encode {cost.compress_s*1e3:7.2f}"
                  f" ms  decode {cost.decompress_s*1e3:7.2f} ms  comm {cost.comm_s*1e3:7.2f} ms"
                  f"  bytes {cost.bytes_out}")
        small = x[: 1 << 16]
        outs = [torch.empty_like(small)]
        b = small.clone()
        with strict.payload_device(dev, strict=True):
            cc.all_gather_into(raw, c, small, outs, None, 1)
            cc.broadcast(raw, c, b, 0, 0, None)
            cc.reduce_scatter(raw, c, small, torch.empty_like(small), None, 1)
        assert torch.equal(outs[0], b), spec  # the same payload decodes the same everywhere
    through_patch(dev)
    if dev.type == "cuda":
        overlap(raw, dev)
    else:
        print("overlap: skipped (side streams need CUDA)")
    print("device_check_collectives: OK")
    dist.destroy_process_group()


class Loopback:
    """Raw collectives of rank 0 of an n-rank group whose peers send what it sends, each
    slot moved by a real call on this process's world group of one (NCCL on a GPU)."""

    def __init__(self, raw: SimpleNamespace, n: int):
        self.raw, self.n = raw, n

    def all_to_all_single(self, out, inp, output_split_sizes=None, input_split_sizes=None,
                          group=None):
        k = input_split_sizes[0] if input_split_sizes else inp.numel() // self.n
        for j in range(self.n):  # peer j's slot for rank 0 is its slot 0: this rank's own
            self.raw.all_to_all_single(out[j * k: (j + 1) * k], inp[:k])

    def all_gather_into_tensor(self, out, inp, group=None):
        k = inp.numel()
        for j in range(self.n):
            self.raw.all_gather_into_tensor(out[j * k: (j + 1) * k], inp)

    def broadcast(self, tensor, src, group=None):
        self.raw.broadcast(tensor, 0)


def through_patch(dev: torch.device) -> None:
    """dist.all_reduce of a DP gradient bucket through CompressionPatch, async: on CUDA the
    codec and the payload collectives run on the side stream (a StreamWork comes back), in
    strict-device mode (a tensor allocated without a device lands on meta and the NCCL calls
    refuse it). The patch sees a DP group of 2 (its ranks stubbed: NCCL allows one rank per
    GPU); its values are those of the same compressed call made directly."""
    originals = SimpleNamespace(**{op: getattr(dist, op) for op in OPS})
    patch = CompressionPatch({"dp": DimCompression(make_compressor("none"), 0, False)},
                             Classifier(Grid(tp=1, pp=1, dp=2), hidden_size=8, tokens=8),
                             allreduce="alltoall", strict=True).install()
    loop = Loopback(originals, 2)
    patch.raw = strict.checked(SimpleNamespace(**{op: getattr(loop, op) for op in (
        "all_to_all_single", "all_gather_into_tensor", "broadcast")}))
    ranks = patch_module._group_ranks
    patch_module._group_ranks = lambda group: frozenset({0, 1})
    zfp = "zfp:rate=8" if dev.type == "cuda" else "zfp:rate=8,impl=torch"
    try:
        for spec in ("int8", zfp, "mpc"):
            c = make_compressor(spec)
            patch.switch("dp", DimCompression(c, 0, False))
            x = torch.randn(1 << 20, device=dev)
            y, ref = x.clone(), x.clone()
            work = dist.all_reduce(y, async_op=True)
            if dev.type == "cuda":
                assert isinstance(work, StreamWork), f"{spec}: {type(work).__name__}"
            work.wait()
            with strict.payload_device(dev, strict=True):  # the same call, not patched
                cc.all_reduce(patch.raw, c, ref, None, 2, None, "alltoall")
            assert torch.equal(y, ref), f"{spec}: the patch's result differs from the call's"
            print(f"through the patch: {spec:<12} async all_reduce on "
                  f"{'the side stream' if dev.type == 'cuda' else 'the host'}: the direct "
                  "call's values")
        calls = patch.accountant.stats[("dp", "all_reduce")].compressed_calls
        assert calls == 3, f"{calls} compressed all-reduces recorded, expected 3"
    finally:
        patch_module._group_ranks = ranks
        patch.uninstall()


def overlap(raw, dev: torch.device, repeats: int = 5) -> None:
    """Compressed all-reduce (zfp rate 8, 64 MiB) and 8 matmuls of 4096^2: queued on the
    caller's stream one after the other, then the all-reduce on the side stream (async, as
    the patch runs it) beside the matmuls; same result, and the time of each."""
    c = make_compressor("zfp:rate=8")
    x = torch.randn(16 << 20, device=dev)
    a = torch.randn(4096, 4096, device=dev)
    streams = SideStreams()

    def timed(side: bool) -> tuple[float, torch.Tensor]:
        y = x.clone()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        body = functools.partial(cc.all_reduce, raw, c, y, None, 1, None, "alltoall")
        work = streams.run(dev, body, [y], async_op=True)[1] if side else body()
        for _ in range(8):
            a @ a
        if side:
            work.wait()
        end.record()
        end.synchronize()
        return start.elapsed_time(end), y

    def alone(what: str) -> float:
        y = x.clone()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if what == "all_reduce":
            cc.all_reduce(raw, c, y, None, 1, None, "alltoall")
        else:
            for _ in range(8):
                a @ a
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    timed(False), timed(True), alone("all_reduce"), alone("matmuls")  # warm-up
    serial = min(timed(False)[0] for _ in range(repeats))
    side = min(timed(True)[0] for _ in range(repeats))
    shorter = min(min(alone("all_reduce") for _ in range(repeats)),
                  min(alone("matmuls") for _ in range(repeats)))
    assert torch.equal(timed(False)[1], timed(True)[1]), "side stream changed the result"
    hidden = (serial - side) / shorter
    print(f"overlap: one stream {serial:.2f} ms, side stream {side:.2f} ms "
          f"({serial / side:.2f}x): {hidden:.0%} of the shorter part ({shorter:.2f} ms) "
          f"hidden, goal {OVERLAP_GOAL:.0%}")
    assert hidden >= OVERLAP_GOAL, (
        f"the side stream hid {hidden:.0%} of the shorter part, below the goal "
        f"{OVERLAP_GOAL:.0%}")


if __name__ == "__main__":
    main()
