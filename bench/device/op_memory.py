"""Peak extra memory of each compressed collective against its bound in the layout's
estimate (neoxlab.comm_scratch.op_scratch_bytes), error feedback on where the op has it.

    python bench/device/op_memory.py [--device cpu|cuda] [--mib 16] [--ranks 4]
                                     [--specs none fp16]

One process plays rank 0 of a group whose peers send what it sends (a loopback: only the
wire is simulated; every buffer the collective code allocates is real). Peaks: on CUDA the
allocator's (max_memory_allocated over the call), on CPU the resident-set high-water mark
(neoxlab.comm.memprobe: run with its ALLOCATOR_ENV, which main() sets by re-executing).
"none" sends the raw bytes, the passthrough worst case the bound assumes. Prints a table;
exits 1 when any peak exceeds its bound.
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


def cases(device, mib: int, n: int, spec: str):
    """(op, message bytes, call) per compressed op, with error feedback on all-reduce and
    reduce; tensors are made (and touched) before the call."""
    import torch

    from neoxlab.comm import collectives as cc
    from neoxlab.compress import make_compressor

    c = make_compressor(spec)
    raw = LoopbackRaw(n)
    numel = mib * MIB // 4

    def fresh(count=numel):
        return torch.randn(count, device=device)

    x, res = fresh(), torch.zeros(numel, device=device)
    yield "all_reduce", numel * 4, lambda: cc.all_reduce(raw, c, x, None, n, res, "alltoall")
    yield "all_reduce (2 ranks)", numel * 4, lambda: cc.all_reduce(
        LoopbackRaw(2), c, x, None, 2, res, "allgather")
    for me in (0, 1):  # the owner, and a rank that only sends
        yield f"reduce (rank {me})", numel * 4, lambda me=me: cc.reduce(
            raw, c, x, 0, list(range(n)), me, None, res)
    part = fresh(numel // n)
    outs = [torch.empty_like(part) for _ in range(n)]
    for o in outs:
        o.zero_()
    yield "all_gather", part.numel() * 4, lambda: cc.all_gather_into(raw, c, part, outs, None,
                                                                        n)
    out = torch.zeros(numel // n, device=device)
    yield "reduce_scatter", numel * 4, lambda: cc.reduce_scatter(raw, c, x, out, None, n)
    yield "broadcast", numel * 4, lambda: cc.broadcast(raw, c, x, 0, 0, None)
    yield "send", numel * 4, lambda: cc.send(raw, c, x, 1)
    yield "recv", numel * 4, lambda: cc.recv(raw, c, x, 1)


def measure(device_name: str, mib: int, n: int, specs: list[str]) -> list[dict]:
    import torch

    from neoxlab.comm_scratch import op_scratch_bytes

    torch.set_num_threads(1)
    device = torch.device(device_name)
    rows = []
    for spec in specs:
        for name, nbytes, call in cases(device, mib, n, spec):
            op = name.split(" ")[0]
            group = 2 if "2 ranks" in name else n
            call()  # warm: first-use allocations (codec tables) are not the op's
            peak = peak_of(device, call)
            bound = op_scratch_bytes(op, nbytes, group, 4)
            rows.append({"spec": spec, "op": name, "message_mib": nbytes / MIB,
                         "peak_mib": peak / MIB, "bound_mib": bound / MIB,
                         "within": peak <= bound})
    return rows


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
    args = ap.parse_args(argv)
    if args.device == "cpu":
        from neoxlab.comm import memprobe

        missing = {k: v for k, v in memprobe.ALLOCATOR_ENV.items() if os.environ.get(k) != v}
        if missing:  # glibc reads it at start-up: run again with it
            os.execve(sys.executable, [sys.executable, *sys.argv],
                      {**os.environ, **memprobe.ALLOCATOR_ENV})
    rows = measure(args.device, args.mib, args.ranks, args.specs)
    print(table(rows), flush=True)
    return 0 if all(r["within"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
