"""Every Lassen (LSF + jsrun) job names Spectrum MPI's CUDA hook for its MPI library, and
MVAPICH ranks keep the cores jsrun gives them. The expected lines are written out by hand:

- Spectrum, no GPU buffer through MPI (NCCL only): --smpiargs=-disable_gpu_hooks (else the
  hook fails: "CUDA Hook Library: Failed to find symbol mem_find_dreg_entries");
- Spectrum with a dimension on MPI groups: --smpiargs=-gpu;
- any other MPI: --smpiargs=off;
- MVAPICH2-GDR / MVAPICH-Plus: MV2_ENABLE_AFFINITY=0 (MVP_ENABLE_AFFINITY=0 for MVAPICH-Plus,
  MVAPICH 3's name), so that -c 10 is not narrowed to one core.
"""

from __future__ import annotations

import pytest

from neoxlab.commands.check import check
from neoxlab.commands.plan import plan_run
from neoxlab.config.compose import compose_experiment
from neoxlab.launch import lsf
from neoxlab.tasks import TASKS

JSRUN = "run_ranks jsrun -n 192 -r 4 -a 1 -c 10 -g 1 -b packed:10 -d packed --smpiargs={} \\"
ON_MPI = ["+engine.group_backends.dp=mpi"]  # DP's gradients handed to MPI as CUDA tensors

CASES = [  # (mpi_library, the run hands MPI GPU buffers, smpiargs, exports present, absent)
    ("spectrum", False, "-disable_gpu_hooks", [], ["MV2_ENABLE_AFFINITY"]),
    ("spectrum", True, "-gpu", [], ["MV2_ENABLE_AFFINITY"]),
    ("mvapich2-gdr", False, "off", ["export MV2_ENABLE_AFFINITY=0"], ["MV2_USE_CUDA"]),
    ("mvapich2-gdr", True, "off", ["export MV2_ENABLE_AFFINITY=0", "export MV2_USE_CUDA=1"], []),
    ("mvapich-plus", False, "off",
     ["export MV2_ENABLE_AFFINITY=0", "export MVP_ENABLE_AFFINITY=0"], ["MPIR_CVAR_ENABLE_GPU"]),
    ("mvapich-plus", True, "off", ["export MV2_ENABLE_AFFINITY=0", "export MVP_ENABLE_AFFINITY=0",
                                   "export MPIR_CVAR_ENABLE_GPU=1"], []),
    ("openmpi", False, "off", [], ["MV2_ENABLE_AFFINITY", "opal_cuda"]),
    ("openmpi", True, "off", ["export OMPI_MCA_opal_cuda_support=true"], ["MV2_ENABLE_AFFINITY"]),
    ("mpich", False, "off", [], ["MV2_ENABLE_AFFINITY"]),
]


def script(tmp_path, overrides: list[str]) -> list[str]:
    cfg = compose_experiment("baseline_192gpu", [*overrides, "launch.submit=false"])
    return lsf.render(cfg, plan_run(cfg, check(cfg), root=tmp_path),
                      TASKS[cfg.task.name].program).splitlines()


@pytest.mark.parametrize(("library", "on_mpi", "smpiargs", "present", "absent"), CASES,
                         ids=[f"{c[0]}-{'mpi' if c[1] else 'nccl'}" for c in CASES])
def test_every_lassen_job_names_its_mpis_cuda_hook_and_affinity(tmp_path, library, on_mpi,
                                                                smpiargs, present, absent):
    lines = script(tmp_path, [f"cluster.mpi_library={library}", *(ON_MPI if on_mpi else [])])
    assert JSRUN.format(smpiargs) in lines
    assert sum("jsrun" in line and "--smpiargs" in line for line in lines) == 1
    for line in present:
        assert line in lines
    for name in absent:
        assert not any(name in line for line in lines), name
