"""CLI: ``mpiexec -n N python -m neoxlab.omb <benchmark> [options]``.

Exit codes: 0 ok (or buffer unavailable with --skip-unavailable), 1 validation failed or a
rank crashed (the job is aborted so no rank hangs), 2 bad options or unavailable buffer.
Only rank 0 prints; a table is printed row by row as OSU does, CSV and JSON at the end.
Hidden testing aid: --inject-error corrupts one input element on one rank, so a run with
--validate must report Fail and exit 1 (the tests use it to prove the checks can fail).
"""

from __future__ import annotations

import sys
import traceback

from .buffers import BufferUnavailable
from .mpistart import start_mpi
from .options import OptionError, check_options, parse_args
from .osu_format import format_rows, table_header, table_row
from .runner import iter_rows


def main(argv: list[str] | None = None) -> int:
    try:  # the thread level is an option, and MPI starts at it, so parse first
        opts, parse_error = parse_args(argv), None
    except OptionError as exc:
        opts, parse_error = None, exc
    MPI = start_mpi(opts.thread_level if opts else None)
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()

    def say(msg: str, stream=sys.stdout) -> None:
        if rank == 0:
            print(msg, file=stream, flush=True)

    try:
        if parse_error is not None:
            raise parse_error
        check_options(opts, comm.Get_size())
    except OptionError as exc:
        say(f"neoxlab.omb: error: {exc}", sys.stderr)
        return 2
    rows = []
    try:
        for row in iter_rows(opts, comm):
            if opts.fmt == "table":
                if not rows:
                    say(table_header(opts, comm.Get_size()))
                say(table_row(row, opts))
            rows.append(row)
    except OptionError as exc:
        say(f"neoxlab.omb: error: {exc}", sys.stderr)
        return 2
    except BufferUnavailable as exc:
        if opts.skip_unavailable:
            say(f"neoxlab.omb: skipped: {exc}", sys.stderr)
            return 0
        say(f"neoxlab.omb: error: {exc} (pass --skip-unavailable to skip with exit 0)",
            sys.stderr)
        return 2
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        comm.Abort(1)
    if opts.fmt != "table":
        say(format_rows(rows, opts.fmt, opts))
    failed = [r.size for r in rows if r.validation == "Fail"]
    if failed:
        say(f"neoxlab.omb: validation failed for sizes {failed}", sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
