"""A real sbatch job on the local Slurm: srun starts 4 MPI ranks of the repo's mpi4py.

Checks the path the Slurm launcher relies on: sbatch allocates 4 tasks, srun with the
slurm_local cluster's `mpi` plugin wires MPICH (the pip wheel) to Slurm's PMI, and every rank
sees COMM_WORLD of size 4.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from neoxlab.launch.slurm import submit
from tests.conftest import REPO_ROOT
from tests.integration.slurm import cancel, wait_for_job

RANKS = 4
JOB_TIMEOUT_S = 120

RANK_PROGRAM = """
import sys
from pathlib import Path
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
Path(sys.argv[1], f"rank{rank}.txt").write_text(f"{rank} {size}")
"""

pytestmark = pytest.mark.usefixtures("requires_slurm")


def cluster_mpi() -> str:
    """The srun --mpi plugin the slurm_local cluster config names."""
    return str(OmegaConf.load(REPO_ROOT / "configs/cluster/slurm_local.yaml").mpi)


def job_script(out_dir: Path, log: Path) -> str:
    program = shlex.join([sys.executable, "-c", RANK_PROGRAM, str(out_dir)])
    return (
        "#!/bin/bash\n"
        f"#SBATCH -n {RANKS}\n"
        "#SBATCH -t 3\n"
        "#SBATCH -J neoxlab-smoke\n"
        f"#SBATCH -o {log}\n"
        "export OMP_NUM_THREADS=1\n"
        f"srun --mpi={cluster_mpi()} -n {RANKS} {program}\n"
    )


@pytest.mark.timeout(180)
def test_sbatch_srun_starts_mpi_ranks(tmp_path: Path) -> None:
    out_dir = tmp_path / "ranks"
    out_dir.mkdir()
    log = tmp_path / "job.out"
    script = tmp_path / "job.sh"
    script.write_text(job_script(out_dir, log))

    job_id = submit(script)
    try:
        state = wait_for_job(job_id, JOB_TIMEOUT_S)
    finally:
        cancel(job_id)
    output = log.read_text() if log.exists() else "(no job output)"

    assert state == "COMPLETED", f"job {job_id} ended {state}:\n{output}"
    seen = {}
    for path in sorted(out_dir.glob("rank*.txt")):
        rank, size = map(int, path.read_text().split())
        seen[rank] = size
    assert sorted(seen) == list(range(RANKS)), f"ranks {sorted(seen)}:\n{output}"
    assert set(seen.values()) == {RANKS}, f"COMM_WORLD sizes {seen}:\n{output}"
