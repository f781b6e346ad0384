"""Native (C) vs Python (neoxlab.omb) latency and allreduce on 2 ranks, side by side in one run.

    python bench/omb_compare.py [--rounds 5] [--native build/omb_native]   (make omb-compare)

Why: Python's per-call overhead is what OMB-Py style benchmarks add on top of the MPI
library; the goal is <= 0.3 us over native for latency at 1-8 B and allreduce at 4-64 B.
bench/native/omb_native.c runs the same loops as neoxlab.omb (OSU conventions: warm-up,
barrier, one clock around the timed calls; latency = half a round trip; sizes above
8192 B use the large iteration counts) against the same MPI library (the mpich wheel's
mpicc and mpiexec). Each round launches native and Python for every size range, the order
alternating between rounds so that drifting machine load hits both alike; per size the
median over the rounds is reported: native us, python us, overhead (python - native) and
ratio, then one verdict line per goal and one for the whole goal (PASS or SHORT).
Iteration counts: OSU's for sizes <= 8192 B, fewer above (200 latency, 100 allreduce).
Thread level: by default each side runs as it does for users (native MPI_THREAD_SINGLE as
OSU's MPI_Init; Python mpi4py's default, MPI_THREAD_MULTIPLE, which MPICH pays for on every
call, about 5 us per small allreduce); --thread-level LEVEL runs both at LEVEL (mpi4py
through MPI4PY_RC_THREAD_LEVEL). Single is not the default for neoxlab.omb: with more ranks
than cores (4 ranks on 2 here) MPICH at thread level single slows large all-reduces by
orders of magnitude.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from neoxlab.launch.local import mpiexec_path
from neoxlab.omb import compare, native
from neoxlab.omb.report import parse_table

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "bench" / "native" / "omb_native.c"
DEFAULT_NATIVE = ROOT / "build" / "omb_native"
GOAL_US = 0.3
GOALS = [("latency", 1, 8), ("allreduce", 4, 64)]
RANKS = 2


@dataclass(frozen=True)
class Part:
    """One size range of one benchmark, launched as one native and one Python job."""

    benchmark: str
    lo: int
    hi: int
    iterations: int
    warmup: int

    def args(self) -> list[str]:
        return [self.benchmark, "-m", f"{self.lo}:{self.hi}", "-i", str(self.iterations),
                "-x", str(self.warmup)]


def parts(max_latency: int, max_allreduce: int) -> list[Part]:
    return [
        Part("latency", 0, 8192, 10000, 100),  # OSU's small-message counts
        Part("latency", 16384, max_latency, 200, 10),
        Part("allreduce", 4, 8192, 1000, 100),
        Part("allreduce", 16384, max_allreduce, 100, 10),
    ]


def launch(argv: list[str], timeout: float, env_extra: dict[str, str] | None = None) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    cmd = [mpiexec_path(), "-n", str(RANKS), *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr}")
    return proc.stdout


def run_native(binary: Path, part: Part, timeout: float, level: str | None) -> compare.Times:
    text = launch([str(binary), *part.args(), "-p", "3", "-t", level or "single"], timeout)
    return compare.latencies(parse_table(text))


def run_python(part: Part, timeout: float, level: str | None) -> compare.Times:
    import json

    env = {"MPI4PY_RC_THREAD_LEVEL": level} if level else None
    text = launch([sys.executable, "-m", "neoxlab.omb", *part.args(), "--format", "json"],
                  timeout, env)
    return compare.latencies(json.loads(text)["rows"])


def measure(binary: Path, plan: list[Part], rounds: int, timeout: float, level: str | None
            ) -> dict[str, tuple[list[compare.Times], list[compare.Times]]]:
    """{benchmark: (native rounds, python rounds)}, each round merging that benchmark's parts."""
    out = {p.benchmark: ([{} for _ in range(rounds)], [{} for _ in range(rounds)])
           for p in plan}
    for r in range(rounds):
        for part in plan:
            nat, py = out[part.benchmark]
            first_native = r % 2 == 0
            for is_native in (first_native, not first_native):
                if is_native:
                    nat[r].update(run_native(binary, part, timeout, level))
                else:
                    py[r].update(run_python(part, timeout, level))
        print(f"# round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    return out


def describe(level: str | None) -> str:
    import mpi4py
    from mpi4py import MPI

    lib = " ".join(MPI.Get_library_version().splitlines()[0].split())
    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    py_level = level or os.environ.get("MPI4PY_RC_THREAD_LEVEL") or mpi4py.rc.thread_level
    return (f"# {RANKS} ranks on {os.cpu_count()} cores, load average {load}; {lib}; "
            f"mpi4py {mpi4py.__version__}, Python {sys.version.split()[0]}\n"
            f"# thread level: native {level or 'single'}, python {py_level}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median)")
    ap.add_argument("--native", type=Path, default=None,
                    help=f"native binary (default: build {DEFAULT_NATIVE} if stale)")
    ap.add_argument("--max-latency", type=int, default=4 << 20, help="largest latency size")
    ap.add_argument("--max-allreduce", type=int, default=1 << 20,
                    help="largest allreduce size")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per launch")
    ap.add_argument("--thread-level", choices=["single", "funneled", "serialized", "multiple"],
                    default=None, help="run both sides at this MPI thread level")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: at least one round is needed; pass --rounds 1+")
    try:
        binary = args.native or native.build(SOURCE, DEFAULT_NATIVE)
    except native.NativeBuildError as exc:
        print(f"[bench] {exc}", file=sys.stderr)
        return 1
    print(describe(args.thread_level))
    start = time.perf_counter()
    results = measure(binary, parts(args.max_latency, args.max_allreduce), args.rounds,
                      args.timeout, args.thread_level)
    verdicts = []
    for name, (nat, py) in results.items():
        pairs = compare.pair_up(compare.medians(nat), compare.medians(py))
        print(f"== {name}: median of {args.rounds} rounds, native {binary.name} vs "
              f"python -m neoxlab.omb {name} (numpy buffers)")
        print(compare.format_pairs(pairs))
        verdicts += [compare.verdict(g, pairs, lo, hi, GOAL_US)
                     for g, lo, hi in GOALS if g == name]
    for v in verdicts:
        print(v.line())
    print(compare.goal_line(verdicts))
    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"# {time.perf_counter() - start:.0f} s, load average at the end {load}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
