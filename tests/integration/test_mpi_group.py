"""The MPI process group's torch entry points on 2 real ranks (mpiexec -n 2,
mpi_entry_points_rank.py): each call's result equals the value worked out by hand from both
ranks' inputs (INPUTS: 0 -> [1, 6, 2, 7, 3, 8], 1 -> [5, 2, 6, 1, 7, 0]), which differs from
the calling rank's own input, and the MPI group counted every collective it ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from neoxlab.launch.local import mpiexec_path
from tests.conftest import REPO_ROOT
from tests.integration.mpi_entry_points_rank import INPUTS

pytestmark = pytest.mark.timeout(300)

SUM = [6.0, 8.0, 8.0, 8.0, 10.0, 8.0]
BOTH_RANKS = {  # the same result on either rank
    "all_reduce_SUM": SUM,
    "all_reduce_MAX": [5.0, 6.0, 6.0, 7.0, 7.0, 8.0],
    "all_reduce_MIN": [1.0, 2.0, 2.0, 1.0, 3.0, 0.0],
    "all_reduce_AVG": [3.0, 4.0, 4.0, 4.0, 5.0, 4.0],
    "all_reduce_PRODUCT": [5.0, 12.0, 12.0, 7.0, 21.0, 0.0],
    "all_reduce_async": SUM,
    "all_reduce_bf16": SUM,  # small integers: exact in bf16
    "all_gather_into_tensor": [1.0, 6.0, 2.0, 7.0, 3.0, 8.0, 5.0, 2.0, 6.0, 1.0, 7.0, 0.0],
    "all_gather": [[1.0, 6.0, 2.0, 7.0, 3.0, 8.0], [5.0, 2.0, 6.0, 1.0, 7.0, 0.0]],
}
EXPECTED = {
    0: {**BOTH_RANKS,
        "reduce_scatter_tensor": [6.0, 8.0, 8.0],  # the first half of SUM
        "reduce_scatter": [6.0, 8.0, 8.0],
        "all_to_all_single": [1.0, 6.0, 2.0, 5.0, 2.0, 6.0],  # both ranks' first halves
        "all_to_all_single_uneven": [1.0, 6.0, 5.0, 2.0, 6.0],  # 2 of rank 0's, 3 of 1's
        "broadcast_from_1": INPUTS[1]},
    1: {**BOTH_RANKS,
        "reduce_scatter_tensor": [8.0, 10.0, 8.0],
        "reduce_scatter": [8.0, 10.0, 8.0],
        "all_to_all_single": [7.0, 3.0, 8.0, 1.0, 7.0, 0.0],  # both ranks' second halves
        "all_to_all_single_uneven": [2.0, 7.0, 3.0, 8.0, 1.0, 7.0, 0.0],  # 4 of 0's, 3 of 1's
        "broadcast_from_1": INPUTS[1],  # the source keeps its own
        "reduce_to_1": SUM,
        "recv_from_0": INPUTS[0]},
}
# the MPI group's own names for the collectives above (neoxlab.comm.mpi_group.CALLS)
COUNTED = ("allreduce", "all_gather_single", "allgather", "reduce_scatter_single",
           "reduce_scatter", "all_to_all_single", "broadcast", "reduce", "barrier")


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[int, dict]:
    out = tmp_path_factory.mktemp("mpi_entry_points")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO_ROOT}:{REPO_ROOT / 'src'}")
    proc = subprocess.run(
        [mpiexec_path(), "-n", "2", sys.executable,
         str(REPO_ROOT / "tests/integration/mpi_entry_points_rank.py"), str(out)],
        capture_output=True, text=True, timeout=180, env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {rank: json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)}


@pytest.mark.parametrize("rank", [0, 1])
def test_every_entry_point_gives_the_reduced_or_moved_values(reports, rank):
    report = reports[rank]
    assert report["backend"] == "mpi4py"
    got = report["results"]
    assert sorted(got) == sorted(EXPECTED[rank])
    for name, expected in EXPECTED[rank].items():
        assert got[name] == expected, (rank, name)
        if not (name == "broadcast_from_1" and rank == 1):
            assert expected != INPUTS[rank], name  # the call had to change something


@pytest.mark.parametrize("rank", [0, 1])
def test_every_collective_ran_on_the_mpi_group(reports, rank):
    calls = reports[rank]["calls"]
    for op in COUNTED:
        assert calls.get(op, 0) >= 1, (rank, op, calls)
    assert calls["send" if rank == 0 else "recv"] == 1
