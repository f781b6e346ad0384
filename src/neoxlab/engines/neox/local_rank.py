"""One local rank per process: LOCAL_RANK and the launcher's own variable must agree.

GPT-NeoX puts a rank on GPU `rank % device_count` and asserts LOCAL_RANK equals it, so with
one visible GPU per rank (jsrun -g1, srun --gpus-per-task=1) LOCAL_RANK must be 0 on every
rank. The launchers export the node-local rank (0..3 on a 4-GPU node) under their own names,
and DeepSpeed's engine set-up (0.19.8, DeepSpeedEngine._configure_with_arguments) asserts
`OMPI_COMM_WORLD_LOCAL_RANK == LOCAL_RANK` whenever the Open MPI name is set, which jsrun
(Spectrum MPI) always does. After neoxlab's own rank discovery (which has read them) the
entry therefore sets every launcher local-rank variable of this process to the LOCAL_RANK
GPT-NeoX will use, and keeps the launcher's value under NODE_LOCAL_RANK_ENV.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

# The node-local rank, as each launcher we support exports it:
# jsrun / Spectrum MPI and mpirun / Open MPI; srun; mpiexec of MPICH (hydra) and Intel MPI;
# PMI-based launchers (MVAPICH2's mpirun_rsh, Cray PALS).
LAUNCHER_LOCAL_RANK_VARS = (
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "SLURM_LOCALID",
    "MPI_LOCALRANKID",
    "PMI_LOCAL_RANK",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "PALS_LOCAL_RANKID",
)
NODE_LOCAL_RANK_ENV = "NEOXLAB_NODE_LOCAL_RANK"


def align_local_rank(local_rank: int, node_local_rank: int,
                     environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set LOCAL_RANK and each launcher variable present to local_rank; return what changed.

    Only variables the launcher set are rewritten (an absent one stays absent, so nothing
    mistakes this process for another launcher's)."""
    env = os.environ if environ is None else environ
    changed = {}
    for name in LAUNCHER_LOCAL_RANK_VARS:
        if name in env and env[name] != str(local_rank):
            changed[name] = env[name]
            env[name] = str(local_rank)
    env["LOCAL_RANK"] = str(local_rank)
    env[NODE_LOCAL_RANK_ENV] = str(node_local_rank)
    return changed
