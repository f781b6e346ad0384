"""`python -m neoxlab.omb.task <run_dir>`: the micro-benchmarks as a harness task.

Same run dir conventions as training (per-rank logs, error files, status.json); rank 0 prints
the OSU tables and writes every row to omb.jsonl.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from neoxlab import rundir
from neoxlab.config import Config
from neoxlab.omb.options import OmbOptions, check_options
from neoxlab.omb.report import table_header, table_row
from neoxlab.omb.runner import iter_rows


def options_for(cfg: Config, benchmark: str) -> OmbOptions:
    m = cfg.microbench
    return OmbOptions(
        benchmark=benchmark, buffer=m.buffer, backend=m.backend, dtype=m.dtype,
        min_size=m.min_size, max_size=m.max_size, iterations=m.iterations, warmup=m.warmup,
        validate=m.validate, full=m.full, barrier=m.barrier, compress=m.compress,
    )


def run(cfg: Config, run_dir: Path, comm, terminal) -> int:
    rank, size = comm.Get_rank(), comm.Get_size()
    all_options = [options_for(cfg, b) for b in cfg.microbench.benchmarks]
    for opts in all_options:  # every benchmark's options checked before any runs
        check_options(opts, size)
    failures = 0
    out = (run_dir / "omb.jsonl").open("a") if rank == 0 else None
    for opts in all_options:
        if rank == 0:
            print(table_header(opts, size), file=terminal, flush=True)
        for row in iter_rows(opts, comm):
            failures += row.validation == "Fail"
            if out is not None:
                print(table_row(row, opts), file=terminal, flush=True)
                out.write(json.dumps({"benchmark": opts.benchmark, **asdict(row)}) + "\n")
    if out is not None:
        out.close()
    return 1 if failures else 0


def main(run_dir: Path) -> int:
    from neoxlab.omb.mpistart import start_mpi

    MPI = start_mpi(None)  # thread level single, as OSU (and the CLI) run
    from neoxlab.rankjob import record_failure, redirect_output

    cfg = rundir.load_config(run_dir)
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    terminal = redirect_output(run_dir, rank)
    rundir.write_atomic(run_dir / "logs" / f"rank{rank}.pid", str(os.getpid()))
    try:
        if rank == 0:
            rundir.set_status(run_dir, "running", world_size=comm.Get_size())
        code = run(cfg, run_dir, comm, terminal)
    except BaseException as exc:  # noqa: BLE001 - a failing rank must end the job
        record_failure(run_dir, rank, exc)
        comm.Abort(1)
        return 1
    rundir.write_atomic(run_dir / "logs" / f"rank{rank}.done", "")
    if rank == 0:
        state = "completed" if code == 0 else "failed"
        extra = {} if code == 0 else {"error": "validation failed (see omb.jsonl)"}
        rundir.set_status(run_dir, state, exit_code=code, **extra)
    return code


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m neoxlab.omb.task <run_dir>")
    sys.exit(main(Path(sys.argv[1])))
