"""The paper's configuration as the MPI library would have run it: MVAPICH-Plus compressing
fp32 (MPI_FLOAT only) at 192 GPUs (experiments/*_mvapich_192gpu.yaml), beside the framework
codecs' runs. Their LSF jobs (lines stated by hand; shellcheck runs over them with every
*gpu experiment in test_jobscripts.py) and their rows in predict_lassen's tables."""

from __future__ import annotations

import pytest

from neoxlab.commands.check import check
from neoxlab.commands.plan import plan_run
from neoxlab.config.compose import compose_experiment
from neoxlab.launch import lsf
from neoxlab.perfmodel import prediction_tables
from neoxlab.perfmodel.predict import predict
from neoxlab.tasks import TASKS

MVAPICH_LINES = [
    "run_ranks jsrun -n 192 -r 4 -a 1 -c 10 -g 1 -b packed:10 -d packed --smpiargs=off \\",
    "export MPIR_CVAR_ENABLE_COMPRESSION=1", "export MPIR_CVAR_COMPRESSION_ALGORITHM=zfp",
    "export MPIR_CVAR_COMPRESSION_DATA_TYPE=FLOAT", "export MPIR_CVAR_ZFP_RATE=8",
    "export MPIR_CVAR_ENABLE_GPU=1",  # DP gradients reach the library as CUDA tensors
    "export MV2_ENABLE_AFFINITY=0", "export MVP_ENABLE_AFFINITY=0",
    "module load cuda/11.8.0", "#BSUB -nnodes 48",
]


@pytest.mark.parametrize(("experiment", "on_mpi"), [("naive_mvapich_192gpu", ["dp", "tp"]),
                                                    ("hybrid_mvapich_192gpu", ["dp"])])
def test_mvapich_fp32_experiments_render_lassen_jobs(tmp_path, experiment, on_mpi):
    cfg = compose_experiment(experiment, ["launch.submit=false"])
    assert cfg.compression.backend == "mpi" and cfg.cluster.mpi_library == "mvapich-plus"
    assert cfg.compression.communication_dtype == "fp32"  # MVAPICH compresses FLOAT only
    assert sorted(b for b, v in cfg.engine.group_backends.items() if v == "mpi") == on_mpi
    lines = lsf.render(cfg, plan_run(cfg, check(cfg), root=tmp_path),
                      TASKS[cfg.task.name].program).splitlines()
    for line in MVAPICH_LINES:
        assert line in lines, line


def test_predict_lassen_tables_the_mvapich_runs_beside_ours():
    lassen = compose_experiment("predict_lassen", [])
    assert {"naive_mvapich_192gpu", "hybrid_mvapich_192gpu"} <= set(lassen.runs)
    names = ["baseline_192gpu", "naive_192gpu", "naive_mvapich_192gpu", "hybrid_192gpu",
             "hybrid_mvapich_192gpu"]
    preds = [predict(compose_experiment(n, [])) for n in names]
    frame = prediction_tables.table(preds)
    assert list(frame["experiment"]) == names
    gains = dict(zip(frame["experiment"], frame["tflops_gain_pct"], strict=True))
    assert all(gains[n] == gains[n] for n in names[1:])  # every run has its gain (not NaN)
    # the library sends fp32 where ours sends fp16: not the same prediction
    assert gains["naive_mvapich_192gpu"] != gains["naive_192gpu"]
    text = prediction_tables.published_comparison(frame)
    rows = {line.split()[0]: line for line in text.splitlines()[2:] if "_192gpu" in line}
    assert set(rows) == set(names[1:])
    assert "+22.5" in rows["naive_mvapich_192gpu"] and "+17.3" in rows["hybrid_mvapich_192gpu"]
    notes = [n for p in preds[2::2] for n in p.notes]
    assert any("mvapich-plus sends" in n and "uncompressed" in n for n in notes)
    assert not any("NVRTC" in n or "torch-ops" in n for n in notes)  # the library's codecs
