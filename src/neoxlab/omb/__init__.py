"""OSU-compatible micro-benchmarks for Python MPI, torch.distributed and compressed collectives.

CLI: ``mpiexec -n N python -m neoxlab.omb <benchmark> [options]``; Python:
``run_benchmark(OmbOptions(...))`` then ``format_rows(rows, "json", options)``.
Nothing here imports mpi4py or torch until a benchmark runs.
"""

from .buffers import BufferUnavailable
from .options import BENCHMARKS, OmbOptions, OptionError, check_options, parse_args
from .osu_format import Row, busbw_factor, format_rows
from .runner import iter_rows, run_benchmark

__all__ = [
    "BENCHMARKS", "BufferUnavailable", "OmbOptions", "OptionError", "Row", "busbw_factor",
    "check_options", "format_rows", "iter_rows", "parse_args", "run_benchmark",
]
