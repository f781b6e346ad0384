"""Compressed vs plain all-reduce on gloo and on MPI, 1-256 MiB: time and peak extra memory.

    python bench/collective_memory.py [--ranks 2] [--specs fp16 int8] [--max-mib 256]
                                      [--backends gloo mpi]

Why: a compressed all-reduce must not need several copies of a gradient bucket (DeepSpeed's
ZeRO-1 bucket of a 20B model is ~2.6 GB in fp16). Every rank runs torch.distributed's
all_reduce and neoxlab.comm.collectives.all_reduce (the training path: segmented all-to-all
of fixed-size payloads, fp32 local sum, all-gather) on the same fp32 tensor, size by size;
reported: median ms of each, and the largest peak extra resident memory over the ranks
(neoxlab.comm.memprobe) as a multiple of the message, next to the layout's bound
(neoxlab.comm_scratch.scratch_bytes). Each backend is a group over every rank: gloo, and
mpi = neoxlab.comm.mpi_group (torch process group over mpi4py: MPI_Allreduce for plain, the
same all-to-all/all-gather for compressed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

MIB = 1 << 20


def worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    from neoxlab.comm import collectives as cc
    from neoxlab.comm import memprobe, mpi_group
    from neoxlab.comm.patch import SMALL_GROUP
    from neoxlab.compress import make_compressor
    from neoxlab.run import dist as neox_dist

    torch.set_num_threads(1)
    info = neox_dist.discover()
    dist.init_process_group("gloo")
    n = info.world_size
    algorithm = "allgather" if n <= SMALL_GROUP else "alltoall"
    groups = {"gloo": dist.new_group(list(range(n)), backend="gloo")}
    if "mpi" in args.backends:
        groups["mpi"] = dist.new_group(list(range(n)), backend=mpi_group.register())
    rows = []
    size = args.min_mib * MIB
    while size <= args.max_mib * MIB:
        x = torch.randn(size // 4, generator=torch.Generator().manual_seed(info.rank))
        work = x.clone()
        variants = {}
        for backend in args.backends:
            g = groups[backend]
            variants[(backend, "plain")] = lambda w=work, g=g: dist.all_reduce(w, group=g)
            for spec in args.specs:
                comp = make_compressor(spec)
                variants[(backend, spec)] = lambda c=comp, w=work, g=g: cc.all_reduce(
                    dist, c, w, g, n, algorithm=algorithm)
        for (backend, name), fn in variants.items():
            times, peaks = [], []
            for _ in range(args.repeats):
                work.copy_(x)
                dist.barrier()
                t0 = time.perf_counter()
                _, peak = memprobe.peak_extra_bytes(fn)
                times.append(time.perf_counter() - t0)
                peaks.append(peak)
            t = torch.tensor([statistics.median(times), max(peaks)], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            rows.append({"backend": backend, "variant": name, "size": size,
                         "ms": t[0].item() * 1e3, "peak": t[1].item()})
        size *= 4 if size < 64 * MIB else 2
    if info.rank == 0:
        print(json.dumps({"rows": rows, "ranks": n, "algorithm": algorithm}))
    dist.barrier()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--specs", nargs="+", default=["fp16", "int8"])
    ap.add_argument("--min-mib", type=int, default=1)
    ap.add_argument("--max-mib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backends", nargs="+", default=["gloo", "mpi"], choices=["gloo", "mpi"])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    from neoxlab.comm_scratch import scratch_bytes
    from neoxlab.launch.local import mpiexec_path

    cmd = [mpiexec_path(), "-n", str(args.ranks), sys.executable, str(Path(__file__).resolve()),
           "--worker", "--specs", *args.specs, "--min-mib", str(args.min_mib),
           "--max-mib", str(args.max_mib), "--repeats", str(args.repeats),
           "--backends", *args.backends]
    from neoxlab.comm.memprobe import ALLOCATOR_ENV

    env = {**os.environ, "OMP_NUM_THREADS": "1", **ALLOCATOR_ENV}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        print(f"[bench] {' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}",
              file=sys.stderr)
        return 1
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"# {doc['ranks']} ranks, compressed algorithm {doc['algorithm']}; median of "
          f"{args.repeats}; vs plain = / the same backend's plain all_reduce; peak = largest "
          "extra resident memory over ranks / message")
    print(f"{'MiB':>5} {'backend':<8}{'variant':<12}{'ms':>10}{'vs plain':>10}{'peak':>8}"
          f"{'bound':>8}")
    plain = {(r["backend"], r["size"]): r["ms"] for r in doc["rows"] if r["variant"] == "plain"}
    for r in doc["rows"]:
        bound = scratch_bytes(r["size"]) / r["size"] if r["variant"] != "plain" else 0.0
        print(f"{r['size'] // MIB:>5} {r['backend']:<8}{r['variant']:<12}{r['ms']:>10.1f}"
              f"{r['ms'] / plain[(r['backend'], r['size'])]:>10.2f}"
              f"{r['peak'] / r['size']:>8.2f}{bound:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
