"""OSU C (optional) vs native (C) vs Python (neoxlab.omb): latency and allreduce on 2 ranks.

    python bench/omb_compare.py [--rounds 5] [--native build/omb_native]   (make omb-compare)
        [--osu-dir ~/osu-micro-benchmarks-7.4] [--thread-level single]

--osu-dir: a directory holding the user's own build of the OSU Micro-Benchmarks (its
osu_latency and osu_allreduce binaries are found below it). They then run in every round
beside the other two, with the same -m/-i/-x and -T mpi_float for allreduce (neoxlab.omb's
and omb_native's default), and the overhead goal is judged against OSU itself. Nothing of
OSU ships with neoxlab; this script only runs binaries the user built.

Why: Python's per-call overhead is what OMB-Py style benchmarks add on top of the MPI
library; the goal is <= 0.3 us over native for latency at 1-8 B and allreduce at 4-64 B.
bench/native/omb_native.c runs the same loops as neoxlab.omb (OSU 7.4's timing: a clock
around each call, a barrier after each allreduce; latency = half a round trip; sizes above
8192 B use the large iteration counts) against the same MPI library (the mpich wheel's
mpicc and mpiexec). Each round launches native and Python for every size range, the order
alternating between rounds so that drifting machine load hits both alike; per size the
median over the rounds is reported: native us, python us, overhead (python - native) and
ratio, the range of the overhead over single rounds (each round's python minus the same
round's reference), then one verdict line per goal and one for the whole goal (PASS or
SHORT).
Iteration counts: OSU's for sizes <= 8192 B, fewer above (200 latency, 100 allreduce).
Thread level: every side runs at --thread-level (default single, OSU's and neoxlab.omb's
default); OSU's binaries call MPI_Init, so a level other than single reaches them through
MPICH's MPIR_CVAR_DEFAULT_THREAD_LEVEL.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from neoxlab.launch.local import mpiexec_path
from neoxlab.omb import compare, native
from neoxlab.omb.osu_format import parse_table

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

    def options(self) -> list[str]:
        return ["-m", f"{self.lo}:{self.hi}", "-i", str(self.iterations), "-x", str(self.warmup)]

    def args(self) -> list[str]:
        """omb_native's and neoxlab.omb's form: the benchmark, then the options."""
        return [self.benchmark, *self.options()]


def parts(max_latency: int, max_allreduce: int) -> list[Part]:
    plan = [Part("latency", 0, min(8192, max_latency), 10000, 100),  # OSU's small counts
            Part("allreduce", 4, min(8192, max_allreduce), 1000, 100)]
    if max_latency > 8192:
        plan.append(Part("latency", 16384, max_latency, 200, 10))
    if max_allreduce > 8192:
        plan.append(Part("allreduce", 16384, max_allreduce, 100, 10))
    return plan


SIDES = ("osu", "native", "python")


def osu_binaries(osu_dir: Path) -> dict[str, Path]:
    """{benchmark: binary} for osu_latency and osu_allreduce found below osu_dir."""
    found = {}
    for name in ("latency", "allreduce"):
        hits = sorted(p for p in osu_dir.rglob(f"osu_{name}") if p.is_file()
                      and os.access(p, os.X_OK))
        if not hits:
            raise SystemExit(f"[bench] --osu-dir {osu_dir}: no executable osu_{name} below it; "
                             "build OSU there first (./configure CC=.venv/bin/mpicc && make)")
        found[name] = hits[0]
    return found


def launch(argv: list[str], timeout: float, env_extra: dict[str, str] | None = None) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    cmd = [mpiexec_path(), "-n", str(RANKS), *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr}")
    return proc.stdout


def run_osu(binaries: dict[str, Path], part: Part, timeout: float, level: str
            ) -> compare.Times:
    extra = ["-T", "mpi_float"] if part.benchmark == "allreduce" else []
    env = None if level == "single" else {
        "MPIR_CVAR_DEFAULT_THREAD_LEVEL": f"MPI_THREAD_{level.upper()}"}
    # options only: OSU's parser stops at a positional word and would silently run its
    # defaults (MPI_CHAR, 1 B-1 MiB, 10000 iterations) instead
    text = launch([str(binaries[part.benchmark]), *part.options(), *extra], timeout, env)
    if extra and "# Datatype: MPI_FLOAT." not in text:
        raise RuntimeError(f"osu_allreduce did not take -T mpi_float:\n{text[:400]}")
    return compare.latencies(parse_table(text))


def run_native(binary: Path, part: Part, timeout: float, level: str) -> compare.Times:
    text = launch([str(binary), *part.args(), "-p", "3", "-t", level], timeout)
    return compare.latencies(parse_table(text))


def run_python(part: Part, timeout: float, level: str) -> compare.Times:
    text = launch([sys.executable, "-m", "neoxlab.omb", *part.args(), "--format", "json",
                   "--thread-level", level], timeout)
    return compare.latencies(json.loads(text)["rows"])


def measure(runners: dict, plan: list[Part], rounds: int
            ) -> dict[str, dict[str, list[compare.Times]]]:
    """{benchmark: {side: rounds}}; the order of the sides rotates from round to round."""
    out = {p.benchmark: {side: [{} for _ in range(rounds)] for side in runners} for p in plan}
    sides = list(runners)
    for r in range(rounds):
        order = sides[r % len(sides):] + sides[:r % len(sides)]
        for part in plan:
            for side in order:
                out[part.benchmark][side][r].update(runners[side](part))
        print(f"# round {r + 1}/{rounds} done ({' '.join(order)})", file=sys.stderr,
              flush=True)
    return out


def describe(level: str, osu: dict[str, Path] | None) -> str:
    import mpi4py
    from mpi4py import MPI

    lib = " ".join(MPI.Get_library_version().splitlines()[0].split())
    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    where = f"; OSU binaries {osu['allreduce'].parent.parent}" if osu else ""
    return (f"# {RANKS} ranks on {os.cpu_count()} cores, load average {load}; {lib}; "
            f"mpi4py {mpi4py.__version__}, Python {sys.version.split()[0]}\n"
            f"# thread level {level} on every side; allreduce in MPI_FLOAT{where}")


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
                    default="single", help="MPI thread level of every side (default single)")
    ap.add_argument("--osu-dir", type=Path, default=None,
                    help="your OSU Micro-Benchmarks build: run its binaries side by side")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: at least one round is needed; pass --rounds 1+")
    osu = osu_binaries(args.osu_dir) if args.osu_dir else None
    try:
        binary = args.native or native.build(SOURCE, DEFAULT_NATIVE)
    except native.NativeBuildError as exc:
        print(f"[bench] {exc}", file=sys.stderr)
        return 1
    print(describe(args.thread_level, osu))
    level, limit = args.thread_level, args.timeout
    runners = {"native": lambda part: run_native(binary, part, limit, level),
               "python": lambda part: run_python(part, limit, level)}
    if osu:
        runners = {"osu": lambda part: run_osu(osu, part, limit, level), **runners}
    start = time.perf_counter()
    results = measure(runners, parts(args.max_latency, args.max_allreduce), args.rounds)
    verdicts = []
    for name, sides in results.items():
        med = {side: compare.medians(rounds) for side, rounds in sides.items()}
        reference = "osu" if osu else "native"
        pairs = compare.pair_up(med[reference], med["python"])
        spread = compare.overhead_range(sides[reference], sides["python"])
        print(f"== {name}: median of {args.rounds} rounds; python -m neoxlab.omb {name} "
              f"(numpy buffers) against {'OSU C' if osu else binary.name}; overhead range: "
              "lowest..highest python - reference of single rounds")
        if osu:
            print(compare.format_sides(med, ("osu", "native", "python"), spread))
        else:
            print(compare.format_pairs(pairs, spread))
        verdicts += [compare.verdict(g, pairs, lo, hi, GOAL_US,
                                     "OSU C" if osu else "native")
                     for g, lo, hi in GOALS if g == name]
    for v in verdicts:
        print(v.line())
    print(compare.goal_line(verdicts))
    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"# {time.perf_counter() - start:.0f} s, load average at the end {load}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
