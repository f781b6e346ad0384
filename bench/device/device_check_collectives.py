"""One-GPU check of the compressed collectives on NCCL (section 3 of bench/device/device_check.sh;
`--device cpu`: a dry run on gloo).

One GPU allows one NCCL rank, so this cannot show a multi-rank exchange; it shows what a
CPU machine cannot: every tensor the compressed path hands to an NCCL group is a CUDA tensor
(NCCL raises on any other), in strict-device mode, for every op and for fixed-size (zfp, int8,
fp16) and data-dependent (mpc) codecs, and it times the codec and communication phases with
CUDA events against the plain collective. Last, the overlap the side stream buys: a
compressed all-reduce beside matmuls on the caller's stream, against both on one stream.
"""

from __future__ import annotations

import argparse
import functools
from types import SimpleNamespace

import torch
import torch.distributed as dist

from neoxlab.comm import collectives as cc
from neoxlab.comm import strict
from neoxlab.comm.side_stream import SideStreams
from neoxlab.compress import make_compressor
from neoxlab.run.dist import free_port

OPS = ("all_reduce", "all_gather_into_tensor", "all_to_all_single", "broadcast")


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
    if dev.type == "cuda":
        overlap(raw, dev)
    else:
        print("overlap: skipped (side streams need CUDA)")
    print("device_check_collectives: OK")
    dist.destroy_process_group()


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

    timed(False), timed(True)  # warm-up
    serial = min(timed(False)[0] for _ in range(repeats))
    side = min(timed(True)[0] for _ in range(repeats))
    assert torch.equal(timed(False)[1], timed(True)[1]), "side stream changed the result"
    print(f"overlap: one stream {serial:.2f} ms, side stream {side:.2f} ms "
          f"({serial / side:.2f}x)")


if __name__ == "__main__":
    main()
