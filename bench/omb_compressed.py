"""Compressed vs plain allreduce, 1-64 MiB, on MPI (mpi4py) and gloo (torch), side by side.

    python bench/omb_compressed.py [--ranks 2] [--specs zfp:rate=8 int8] [--backends mpi torch]

Why: compression pays only where the bytes it saves take longer to move than encoding and
decoding them. Every rank runs neoxlab.omb's allreduce (torch CPU buffers, fp32, smooth
data) plainly and with each --specs compressor (neoxlab.omb.compressed, which runs the
training path neoxlab.comm.collectives), size by size, the variants interleaved so each size
sees the same machine load, --rounds times per size (medians reported, so that one burst
from a neighbour cannot decide a crossover). Reported per backend and size: plain us,
compressed us, their ratio, the compression ratio, and the crossover size from which
compression wins (or none).
Then the compressors' encode/decode throughput, measured at each size between its
collectives on every rank at once (one thread each, as in the collective), the plain
allreduce's bus bandwidth, and the link bandwidth below which each compressor would pay
(neoxlab.omb.compare.break_even_GBps, from the median throughputs).
Large allocations use transparent huge pages (THP_MEM_ALLOC_ENABLE=1), for both arms.
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
DEFAULT_SPECS = ["zfp:rate=8", "int8"]


def iterations(size: int) -> int:
    return 10 if size <= 2 * MIB else 5 if size <= 8 * MIB else 3 if size <= 32 * MIB else 2


# ---------------------------------------------------------------- per rank (under mpiexec)

def throughput(specs: list[str], probe_bytes: int) -> dict[str, dict]:
    """Encode/decode GB/s (input bytes) per compressor, all ranks at once; mean over ranks."""
    import torch
    from mpi4py import MPI

    from neoxlab.compress import make_compressor
    from neoxlab.omb.options import DTYPES
    from neoxlab.omb.verify import Patterns

    comm = MPI.COMM_WORLD
    pat = Patterns(DTYPES["float"], comm.size, reduction=True, smooth=True)
    x = torch.from_numpy(pat.data(probe_bytes // 4, comm.rank, 0))

    repeats = 3 if probe_bytes <= 8 * MIB else 2

    def best(fn) -> float:
        times = []
        for _ in range(repeats + 1):  # the first call warms up
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    out = {"clone": {"encode": probe_bytes / best(x.clone) / 1e9}}
    for spec in specs:
        comp = make_compressor(spec)
        enc = comp.encode(x)
        out[spec] = {"encode": probe_bytes / best(lambda c=comp: c.encode(x)) / 1e9,
                     "decode": probe_bytes / best(lambda c=comp, e=enc: c.decode(e)) / 1e9,
                     "ratio": probe_bytes / enc.numel()}
    return {k: {m: comm.allreduce(v) / comm.size for m, v in d.items()} for k, d in out.items()}


def worker(args: argparse.Namespace) -> int:
    import torch
    from mpi4py import MPI

    from neoxlab.omb import OmbOptions, run_benchmark
    from neoxlab.omb.backends import init_torch_distributed

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    if "torch" in args.backends:
        init_torch_distributed(comm, "gloo")  # once; every torch-backend run reuses it
    rows, rates = [], []
    for size in (s * MIB for s in mib_sizes(args.min_mib, args.max_mib)):
        for _ in range(args.rounds):
            # between the collectives of this size, so both see the same machine load
            rates.append({"size": size, **throughput(args.specs, size)})
            for backend, spec in ((b, c) for b in args.backends for c in [None, *args.specs]):
                opts = OmbOptions(benchmark="allreduce", buffer="torch", backend=backend,
                                  min_size=size, max_size=size, iterations=iterations(size),
                                  warmup=1, compress=spec)
                row = run_benchmark(opts, comm)[0]
                rows.append({"backend": backend, "spec": spec, "size": size,
                             "us": row.avg_us, "busbw": row.busbw_GBps,
                             "ratio": row.compression_ratio})
    if comm.rank == 0:
        print(json.dumps({"rows": rows, "throughput": rates, "ranks": comm.size}))
    return 0


# ---------------------------------------------------------------- driver and report

def mib_sizes(lo: int, hi: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def summarize(doc: dict) -> dict:
    """Medians over the rounds: one row per (backend, spec, size), one rate set per size."""
    groups: dict[tuple, list[dict]] = {}
    for r in doc["rows"]:
        groups.setdefault((r["backend"], r["spec"], r["size"]), []).append(r)
    rows = [{"backend": be, "spec": spec, "size": size,
             **{k: statistics.median(r[k] for r in rs) if rs[0][k] is not None else None
                for k in ("us", "busbw", "ratio")}}
            for (be, spec, size), rs in groups.items()]
    by_size: dict[int, list[dict]] = {}
    for r in doc["throughput"]:
        by_size.setdefault(r["size"], []).append(r)
    rates = {size: {name: {m: statistics.median(r[name][m] for r in rs) for m in rs[0][name]}
                    for name in rs[0] if name != "size"}
             for size, rs in by_size.items()}
    return {"ranks": doc["ranks"], "rows": rows, "throughput": rates}


LABEL = {"mpi": "MPI (mpi4py)", "torch": "gloo (torch.distributed)"}


def report_times(doc: dict, specs: list[str], backends: list[str]) -> list[str]:
    """Per backend and compressor: plain vs compressed us per size, and the crossover."""
    from neoxlab.omb.compare import crossover

    lines = []
    for be in backends:
        rows = [r for r in doc["rows"] if r["backend"] == be]
        plain = {r["size"]: r["us"] for r in rows if r["spec"] is None}
        lines.append(f"== allreduce on {LABEL[be]}, {doc['ranks']} ranks, fp32 smooth data")
        for spec in specs:
            comp = {r["size"]: r for r in rows if r["spec"] == spec}
            lines.append(f"{'# Size':<10}{'plain us':>12}{spec + ' us':>18}{'x plain':>9}"
                         f"{'CR':>7}")
            for size in sorted(plain):
                c = comp[size]
                lines.append(f"{f'{size // MIB} MiB':<10}{plain[size]:>12.0f}{c['us']:>18.0f}"
                             f"{c['us'] / plain[size]:>9.2f}{c['ratio']:>7.2f}")
            cross = crossover(plain, {s: r["us"] for s, r in comp.items()})
            lines.append(f"crossover {spec} on {be}: " + (
                f"compression pays from {cross // MIB} MiB up" if cross else
                f"none in {min(plain) // MIB}-{max(plain) // MIB} MiB: compressed is never "
                "faster here"))
    return lines


def report_throughput(doc: dict, specs: list[str], backends: list[str]) -> list[str]:
    """Compressor GB/s per size, plain bus bandwidth, and the break-even link bandwidth."""
    from neoxlab.omb.compare import break_even_GBps

    n, rates = doc["ranks"], doc["throughput"]
    lines = [f"# compressor throughput, GB/s of uncompressed input, measured at each size "
             f"between its collectives ({n} ranks at once, 1 thread each)",
             f"{'# Size':<10}{'clone':>8}" + "".join(f"{s + ' enc / dec':>26}" for s in specs)]
    for size, r in sorted((int(k), v) for k, v in rates.items()):
        lines.append(f"{f'{size // MIB} MiB':<10}{r['clone']['encode']:>8.2f}" + "".join(
            f"{r[s]['encode']:>17.3f} / {r[s]['decode']:<6.3f}" for s in specs))
    busbw = {be: max(r["busbw"] for r in doc["rows"] if r["backend"] == be
                     and r["spec"] is None) for be in backends}
    lines.append("plain allreduce bus bandwidth (best size): " + ", ".join(
        f"{be} {busbw[be]:.2f} GB/s" for be in backends))
    for spec in specs:
        r = {m: statistics.median(v[spec][m] for v in rates.values())
             for m in ("encode", "decode", "ratio")}
        b = break_even_GBps(n, r["ratio"], r["encode"], r["decode"])
        head = (f"{spec} (median encode {r['encode']:.3f}, decode {r['decode']:.3f} GB/s, "
                f"ratio {r['ratio']:.2f})")
        if b is None:
            lines.append(f"{head}: never pays at {n} ranks: ratio <= n/2, so the all-gather "
                         "of compressed copies moves no fewer bytes than a ring allreduce")
            continue
        here = ", ".join(f"{be} {busbw[be] / b:.1f}x" for be in backends)
        word = "so it cannot pay here" if all(busbw[be] > b for be in backends) else \
            "so by this model it could pay here; the measured crossover above decides"
        lines.append(f"{head}: pays only on links below {b:.3f} GB/s per rank (encode + {n} "
                     f"decodes must cost less than the wire time saved); this machine's "
                     f"loopback bus bandwidth is {here} that, {word}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2, help="2 or 4 (the machine has 2 cores)")
    ap.add_argument("--specs", nargs="+", default=DEFAULT_SPECS, help="compressor specs")
    ap.add_argument("--backends", nargs="+", default=["mpi", "torch"], choices=["mpi", "torch"])
    ap.add_argument("--rounds", type=int, default=3, help="rounds per size (median)")
    ap.add_argument("--min-mib", type=int, default=1)
    ap.add_argument("--max-mib", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds for the whole run")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: at least one round is needed; pass --rounds 1+")
    if args.ranks not in (2, 4):
        ap.error(f"--ranks {args.ranks}: this bench runs on 2 or 4 ranks; pass --ranks 2")
    from neoxlab.launch.local import mpiexec_path

    cmd = [mpiexec_path(), "-n", str(args.ranks), sys.executable, str(Path(__file__).resolve()),
           "--worker", "--specs", *args.specs, "--backends", *args.backends,
           "--min-mib", str(args.min_mib), "--max-mib", str(args.max_mib),
           "--rounds", str(args.rounds)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "THP_MEM_ALLOC_ENABLE": "1"}
    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"# {args.ranks} ranks on {os.cpu_count()} cores, load average {load}; "
          f"specs {' '.join(args.specs)}; median of {args.rounds} rounds per size")
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    if proc.returncode != 0:
        print(f"[bench] {' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr}",
              file=sys.stderr)
        return 1
    doc = summarize(json.loads(proc.stdout.strip().splitlines()[-1]))
    print("\n".join(report_times(doc, args.specs, args.backends)
                    + report_throughput(doc, args.specs, args.backends)))
    print(f"# {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
