"""`python -m neoxlab.omb.task <run_dir>`: the micro-benchmarks as a harness task.

Same run dir conventions as training (run.rankjob.run_rank: per-rank logs, error files,
status.json with its attempts); rank 0 prints the OSU tables and writes every row to omb.jsonl.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from neoxlab.config import Config
from neoxlab.omb.mpistart import start_mpi
from neoxlab.omb.options import OmbOptions, OptionError, check_options
from neoxlab.omb.osu_format import Row, table_header, table_row
from neoxlab.omb.runner import iter_rows
from neoxlab.run.rankjob import run_rank


def options_for(cfg: Config, benchmark: str) -> OmbOptions:
    m = cfg.omb
    return OmbOptions(
        benchmark=benchmark, buffer=m.buffer, backend=m.backend, dtype=m.dtype,
        min_size=m.min_size, max_size=m.max_size, iterations=m.iterations, warmup=m.warmup,
        validate=m.validate, full=m.full, barrier=m.barrier, compress=m.compress,
    )


def rules(cfg: Config, world: int) -> list[str]:
    """Every benchmark's options, checked as the ranks would check them, before any starts."""
    k = cfg.omb.groups
    if k < 1 or world % k:
        return [f"omb.groups={k} with {world} ranks: the ranks split into equal "
                "concurrent groups, so groups must be >= 1 and divide the rank count; set "
                f"omb.groups to a divisor of {world}"]
    errors = []
    for benchmark in cfg.omb.benchmarks:
        try:
            check_options(options_for(cfg, benchmark), world // k)
        except OptionError as exc:
            errors.append(f"omb ({benchmark}): {exc}")
    return errors


def group_of(cfg: Config, rank: int, world_size: int) -> int:
    """A world rank's concurrent group (omb.groups = k): every k-th rank (one per node), or a
    block of consecutive ranks (omb.within_nodes: a node's)."""
    k = cfg.omb.groups
    return rank // (world_size // k) if cfg.omb.within_nodes else rank % k


def my_group(cfg: Config, comm):
    """This rank's communicator: the world, or its concurrent group."""
    if cfg.omb.groups == 1:
        return comm
    rank = comm.Get_rank()
    return comm.Split(group_of(cfg, rank, comm.Get_size()), rank)


def lockstep(rows: Iterator[Row], world, concurrent: int
             ) -> Iterator[tuple[Row, float | None]]:
    """Concurrent groups start every message size together (a world barrier before each),
    so each size is timed while all groups load the links, not after one has drifted ahead.
    Each row comes with the seconds until every group had finished that size (None with one
    group): flows need not share a link fairly, but together they wait for all its bytes."""
    if concurrent == 1:
        for row in rows:
            yield row, None
        return
    world.Barrier()
    while True:
        start = time.perf_counter()
        row = next(rows, None)
        world.Barrier()
        if row is None:
            return
        yield row, time.perf_counter() - start


def run(cfg: Config, run_dir: Path, world, terminal) -> int:
    comm = my_group(cfg, world)
    rank, size = world.Get_rank(), comm.Get_size()
    concurrent = cfg.omb.groups
    all_options = [options_for(cfg, b) for b in cfg.omb.benchmarks]
    for opts in all_options:  # every benchmark's options checked before any runs
        check_options(opts, size)
    failures = 0
    out = (run_dir / "omb.jsonl").open("a") if rank == 0 else None
    for opts in all_options:
        if rank == 0:
            print(table_header(opts, size), file=terminal, flush=True)
            if concurrent > 1:
                print(f"# {concurrent} groups of {size} ranks run it at once (rows: group 0; "
                      "omb.jsonl also has every group's average)",
                      file=terminal, flush=True)
        for row, all_groups_s in lockstep(iter_rows(opts, comm), world, concurrent):
            failures += row.validation == "Fail"
            extra = {}
            if all_groups_s is not None:
                firsts: dict[int, float] = {}  # each group's first rank's, in group order
                for r, avg in enumerate(world.gather(row.avg_us, root=0) or []):
                    firsts.setdefault(group_of(cfg, r, world.Get_size()), avg)
                extra = {"group_avg_us": list(firsts.values()),
                         "all_groups_s": all_groups_s}
            if out is not None:
                print(table_row(row, opts), file=terminal, flush=True)
                out.write(json.dumps({"benchmark": opts.benchmark, "groups": concurrent,
                                     **asdict(row), **extra}) + "\n")
    if out is not None:
        out.close()
    return 1 if failures else 0


def body(cfg: Config, run_dir: Path, terminal) -> None:
    """The rank body inside run_rank (logs, markers, attempts, status and failure handling)."""
    # deferred: mpi4py initialises MPI on import
    from mpi4py import MPI  # mpi4py initializes MPI on import: only on ranks

    if run(cfg, run_dir, MPI.COMM_WORLD, terminal):
        raise RuntimeError("validation failed (see omb.jsonl)")


def main(run_dir: Path) -> int:
    start_mpi(None)  # thread level single, as OSU (and the CLI) run: before any MPI import
    return run_rank(run_dir, lambda cfg, info, terminal: body(cfg, run_dir, terminal))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m neoxlab.omb.task <run_dir>")
    sys.exit(main(Path(sys.argv[1])))
