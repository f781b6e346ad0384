"""One local rank per process: LOCAL_RANK and the launcher's own variable must agree.

GPT-NeoX puts a rank on GPU `rank % device_count` and asserts LOCAL_RANK equals it, so with
one visible GPU per rank (jsrun -g1, srun --gpus-per-task=1) LOCAL_RANK must be 0 on every
rank, and DeepSpeed asserts `OMPI_COMM_WORLD_LOCAL_RANK == LOCAL_RANK` whenever the Open MPI
name is set (jsrun always sets it). The choice and the alignment are neoxlab.run.device's,
shared with the builtin engine and serving; this module names them for the GPT-NeoX entry.
"""

from __future__ import annotations

from neoxlab.run.device import (
    LAUNCHER_LOCAL_RANK_VARS,
    NODE_LOCAL_RANK_ENV,
    align_local_rank,
)

__all__ = ["LAUNCHER_LOCAL_RANK_VARS", "NODE_LOCAL_RANK_ENV", "align_local_rank"]
