"""Peak extra memory of each compressed collective against its bound in the layout's
estimate (neoxlab.comm_scratch.op_scratch_bytes), error feedback on where the op has it.

    python bench/device/op_memory.py [--device cpu|cuda] [--mib 16] [--ranks 4]
                                     [--specs none fp16] [--dtype float32|bfloat16|float16]
                                     [--device-paths] [--collective-only]
                                     [--ops all_reduce broadcast ...]

One process plays rank 0 of a group whose peers send what it sends (a loopback: only the
wire is simulated; every buffer the collective code allocates is real). Peaks: on CUDA the
allocator's (max_memory_allocated over the call), on CPU the resident-set high-water mark
(neoxlab.comm.memprobe: run with its ALLOCATOR_ENV, which main() sets by re-executing).
"none" sends the raw bytes, the passthrough worst case the bound assumes. The bound counts
the codec's own temporaries too (comm_scratch.codec_scratch_bytes: codecs work in slices);
--collective-only leaves them out, for codecs that write straight into the collective's
buffers (none, fp16), so that the collective's own buffers are checked closely.
--device-paths runs the codecs' device paths on CPU (ZFP's torch ops in device-sized chunks,
mpc's and topk's device paths), so that a CPU run holds what a GPU would.
Point-to-point ops replay what this process sent (loopback.py), so the senders run first.
Prints a table; exits 1 when any peak exceeds its bound.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from loopback import LoopbackRaw  # bench/device/loopback.py (this script's folder)

MIB = 1 << 20


def peak_of(device, fn: Callable[[], object]) -> int:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    from neoxlab.comm import memprobe

    return memprobe.peak_extra_bytes(fn)[1]


def cases(device, mib: int, n: int, spec: str, dtype):
    """(op, message bytes, call, its loopback) per compressed op, with error feedback on
    all-reduce and reduce; tensors are made (and touched) before the call. A sender comes
    before its receiver (reduce's rank 1 before the owner, send before recv): the loopback
    replays what the sender's first (warm-up) call sent."""
    import torch

    from neoxlab.comm import collectives as cc
    from neoxlab.compress import make_compressor

    c = make_compressor(spec)
    raw = LoopbackRaw(n)
    size = torch.tensor([], dtype=dtype).element_size()
    numel = mib * MIB // size

    def fresh(count=numel):
        return torch.randn(count, device=device).to(dtype)

    x, res = fresh(), torch.zeros(numel, device=device, dtype=dtype)
    nbytes = numel * size
    yield "all_reduce", nbytes, lambda: cc.all_reduce(raw, c, x, None, n, res,
                                                        "alltoall"), raw
    pair = LoopbackRaw(2)
    yield "all_reduce (2 ranks)", nbytes, lambda: cc.all_reduce(
        pair, c, x, None, 2, res, "allgather"), pair
    p2p = LoopbackRaw(n)
    for me in (1, 0):  # a rank that only sends, then the owner
        yield f"reduce (rank {me})", nbytes, lambda me=me: cc.reduce(
            p2p, c, x, 0, list(range(n)), me, None, res), p2p
    part = fresh(numel // n)
    outs = [torch.empty_like(part) for _ in range(n)]
    for o in outs:
        o.zero_()
    yield "all_gather", part.numel() * size, lambda: cc.all_gather_into(raw, c, part, outs,
                                                                           None, n), raw
    out = torch.zeros(numel // n, device=device, dtype=dtype)
    yield "reduce_scatter", nbytes, lambda: cc.reduce_scatter(raw, c, x, out, None, n), raw
    yield "broadcast", nbytes, lambda: cc.broadcast(raw, c, x, 0, 0, None), raw
    wire = LoopbackRaw(n)
    yield "send", nbytes, lambda: cc.send(wire, c, x, 1), wire
    yield "recv", nbytes, lambda: cc.recv(wire, c, x, 1), wire


def measure(device_name: str, mib: int, n: int, specs: list[str],
            dtype_name: str = "float32", collective_only: bool = False,
            ops: list[str] | None = None) -> list[dict]:
    import torch

    from neoxlab import comm_scratch

    torch.set_num_threads(1)
    device = torch.device(device_name)
    dtype = getattr(torch, dtype_name)
    itemsize = torch.tensor([], dtype=dtype).element_size()
    rows = []
    for spec in specs:
        for name, nbytes, call, loop in cases(device, mib, n, spec, dtype):
            op = name.split(" ")[0]
            if ops and op not in ops:
                continue
            group = 2 if "2 ranks" in name else n
            call()  # warm: first-use allocations (codec tables) are not the op's
            loop.recording = False  # what it sent is recorded; the measured call's is not
            peak = peak_of(device, call)
            bound = (comm_scratch.collective_scratch_bytes if collective_only
                     else comm_scratch.op_scratch_bytes)(op, nbytes, group, itemsize)
            rows.append({"spec": spec, "op": name, "message_mib": nbytes / MIB,
                         "peak_mib": peak / MIB, "bound_mib": bound / MIB,
                         "within": peak <= bound})
    return rows


def device_paths() -> None:
    """Run the codecs' device paths on CPU tensors: ZFP's torch ops in the chunks an
    accelerator uses, mpc's and topk's whole-message device paths."""
    from neoxlab.compress import mpc, topk, zfp_torch

    zfp_torch.CHUNK_BLOCKS = {}
    mpc.FORCE_DEVICE_PATH = True
    topk.FORCE_DEVICE_PATH = True


def table(rows: list[dict]) -> str:
    lines = [f"{'codec':6} {'op':20} {'message MiB':>11} {'peak extra MiB':>14} "
             f"{'bound MiB':>9} {'peak/message':>12}"]
    for r in rows:
        mark = "" if r["within"] else "  OVER THE BOUND"
        lines.append(f"{r['spec']:6} {r['op']:20} {r['message_mib']:11.1f} {r['peak_mib']:14.2f} "
                     f"{r['bound_mib']:9.2f} {r['peak_mib'] / r['message_mib']:12.2f}{mark}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--specs", nargs="+", default=["none", "fp16"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--device-paths", action="store_true",
                    help="the codecs' device paths on CPU (what a GPU rank holds)")
    ap.add_argument("--collective-only", action="store_true",
                    help="bound without the codec's temporaries (none, fp16)")
    ap.add_argument("--ops", nargs="+", default=None,
                    help="only these ops (default: all; recv replays what send sent)")
    args = ap.parse_args(argv)
    if args.device_paths:
        device_paths()
    if args.device == "cpu":
        from neoxlab.comm import memprobe

        missing = {k: v for k, v in memprobe.ALLOCATOR_ENV.items() if os.environ.get(k) != v}
        if missing:  # glibc reads it at start-up: run again with it
            os.execve(sys.executable, [sys.executable, *sys.argv],
                      {**os.environ, **memprobe.ALLOCATOR_ENV})
    rows = measure(args.device, args.mib, args.ranks, args.specs, args.dtype,
                   args.collective_only, args.ops)
    print(table(rows), flush=True)
    return 0 if all(r["within"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
