"""A REAL GPT-NeoX checkout's start-up through our entry, with a GPU cluster's config.

Runs against the session's checkout (conftest `neox_dir`) with the `[neox]` extra installed
(pkg_resources, sentencepiece, pybind11). GPT-NeoX's own makefile builds the dataset
helpers, and `mpiexec -n 2 python -m neoxlab.engines.neox.entry` runs its train.py: arguments,
tokenizer, distributed set-up as far as a machine without CUDA lets GPT-NeoX go (it asserts
CUDA in initialize_megatron: with cluster.device=v100 no CPU mode patch is applied); that
failure must end the job promptly, as failed, with GPT-NeoX's reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from neoxlab.commands.check import check
from neoxlab.commands.plan import plan_run
from neoxlab.config.compose import compose_experiment
from neoxlab.engines.neox.data_helpers import build_data_helpers, build_environment
from neoxlab.engines.neox.launch import rank_command, rank_env
from neoxlab.run.rundir import load_config

NEOX_DIR = ""  # the session's checkout (conftest neox_dir: NEOXLAB_TEST_NEOX_DIR or vendored)


@pytest.fixture(autouse=True)
def _checkout(neox_dir) -> None:
    """Every test here runs against the checkout; without one they skip, saying why."""
    global NEOX_DIR
    NEOX_DIR = str(neox_dir)
# A few documents in GPT-NeoX's mmap format, written by GPT-NeoX's own builder.
WRITE_DATA = """
import sys, numpy as np
from megatron.data.indexed_dataset import make_builder
builder = make_builder(sys.argv[1] + ".bin", "mmap", vocab_size=512)
text = "neoxlab runs GPT-NeoX's own train.py through its entry. " * 40
for shift in range(16):
    builder.add_item(np.array([2 + (ord(c) + shift) % 500 for c in text], dtype=builder.dtype))
    builder.end_document()
builder.finalize(sys.argv[1] + ".idx")
"""


def _checkout_copy(tmp_path: Path) -> Path:
    """The checkout's megatron/data makefile and helpers source, in a scratch tree."""
    data = tmp_path / "gpt-neox" / "megatron" / "data"
    data.mkdir(parents=True)
    for name in ("Makefile", "helpers.cpp"):
        shutil.copy(Path(NEOX_DIR) / "megatron" / "data" / name, data / name)
    return tmp_path / "gpt-neox"


@pytest.mark.timeout(300)
def test_dataset_helpers_build_with_the_jobs_python(tmp_path):
    neox = _checkout_copy(tmp_path)
    data = neox / "megatron" / "data"
    # A python3 first on PATH that cannot import pybind11, as a cluster's system python.
    other = tmp_path / "other_bin"
    other.mkdir()
    (other / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    (other / "python3").chmod(0o755)
    env = dict(os.environ, PATH=f"{other}:{os.environ['PATH']}")
    env.pop("MAKEFLAGS", None)
    plain = subprocess.run(["make", "-C", str(data)], env=env, capture_output=True,
                           text=True, timeout=240)
    assert plain.returncode != 0 and "pybind11" in plain.stderr  # the defect, reproduced

    old_path = os.environ["PATH"]
    os.environ["PATH"] = env["PATH"]
    try:
        build_data_helpers(neox, tmp_path / "run")
    finally:
        os.environ["PATH"] = old_path
    probe = ("import helpers, sys; print(helpers.__file__); "
             "print(hasattr(helpers, 'build_sample_idx_int32'))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=data, capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    assert Path(out[0]).parent == data and out[1] == "True"
    again = dict(env)
    build_environment(tmp_path / "run", again)  # what GPT-NeoX's own make calls inherit
    redo = subprocess.run(["make", "-C", str(data)], env=again, capture_output=True,
                          text=True, timeout=60)
    assert redo.returncode == 0 and "Nothing to be done" in redo.stdout


@pytest.mark.timeout(600)
def test_gpt_neox_starts_through_our_entry_and_a_failed_start_ends_the_job(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("with CUDA GPT-NeoX would go on to train; this checks the CPU path")
    neox = Path(NEOX_DIR).resolve()
    prefix = tmp_path / "data" / "tiny_text_document"
    prefix.parent.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-c", WRITE_DATA, str(prefix)], cwd=neox, timeout=120,
                   env=dict(env, PYTHONPATH=str(neox)), check=True)
    results = tmp_path / "results"
    cfg = compose_experiment("local_zhybrid", [
        "engine=neox", f"cluster.neox_dir={neox}", "cluster.device=v100",
        "cluster.ranks_per_node=2", "cluster.gpus_per_node=8", "parallel.tp=1",
        "parallel.pp=1", "engine.backend=gloo", "train.precision=fp32", "train.steps=3",
        "data.source=file", f"data.path={prefix}", "data.tokenizer_type=CharLevelTokenizer",
        f"launch.results_dir={results}",
    ])
    run_dir = plan_run(cfg, check(cfg), [], results)
    env.update(rank_env(load_config(run_dir), run_dir), DS_ACCELERATOR="cpu",
               OMP_NUM_THREADS="1")
    mpiexec = str(Path(sys.executable).with_name("mpiexec"))
    proc = subprocess.run([mpiexec, "-n", "2", *rank_command(cfg, run_dir, sys.executable)],
                          env=env, capture_output=True, text=True, timeout=500, cwd=tmp_path,
                          start_new_session=True)
    status = json.loads((run_dir / "status.json").read_text())
    logs = "".join(p.read_text() for p in sorted((run_dir / "logs").glob("rank*.log")))
    assert proc.returncode != 0 and status["state"] == "failed", (status, logs[-3000:])
    # GPT-NeoX got past our arguments, its imports and its tokenizer to its own CUDA check
    # (on whichever rank aborted first; rank 0's progress lines may be cut by the abort).
    assert "Megatron requires CUDA" in status["error"], logs[-3000:]
    assert "megatron/initialize.py" in logs and "pretrain(neox_args=neox_args)" in logs
    helpers = list((neox / "megatron" / "data").glob("helpers*.so"))
    assert helpers, "rank 0 did not build GPT-NeoX's dataset helpers"
