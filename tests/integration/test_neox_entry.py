"""engine=neox without deepy.py: the start-up shim, and real MPI ranks running a stand-in.

No GPT-NeoX checkout exists here (and GPT-NeoX needs GPUs), so the per-rank test runs
tests/fixtures/fake_gpt_neox/train.py, a STAND-IN for GPT-NeoX's train.py that records what
it receives, under a real `mpiexec -n 2`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from neoxlab.commands.check import check
from neoxlab.commands.plan import plan_run
from neoxlab.config.compose import compose_experiment
from neoxlab.engines.neox.launch import SHIM_DIR, rank_command, rank_env
from tests.conftest import REPO_ROOT

FAKE_NEOX = REPO_ROOT / "tests" / "fixtures" / "fake_gpt_neox"
PROBE = """
import json, sys
before = "neoxlab.engines.neox.inject" in sys.modules
import deepspeed, deepspeed.comm, torch.distributed as d
inject = sys.modules.get("neoxlab.engines.neox.inject")
patch = inject.current() if inject else None
print(json.dumps({
    "inject_loaded_at_start": before,
    "torch_patched": d.all_reduce is not d.distributed_c10d.all_reduce,
    "deepspeed_patched": deepspeed.comm.all_reduce is not deepspeed.comm.comm.all_reduce,
    "policies": {k: p.compressor.describe() for k, p in patch.policies.items()} if patch else None,
}))
"""


def _fake_checkout(tmp_path: Path) -> Path:
    neox = tmp_path / "gpt-neox"
    (neox / "megatron" / "neox_arguments").mkdir(parents=True)
    shutil.copy(FAKE_NEOX / "train.py", neox / "train.py")
    return neox


def _plan(tmp_path: Path, neox_dir: Path) -> Path:
    """A planned engine=neox run of 2 ranks (dp=2), zhybrid compression.

    cluster.device is set to a GPU name only so that validation lets engine=neox through;
    the stand-in runs on CPU."""
    results = tmp_path / "results"
    cfg = compose_experiment("local_zhybrid", [
        "engine=neox", f"cluster.neox_dir={neox_dir}", "cluster.device=v100",
        "cluster.gpus_per_node=8",
        "cluster.ranks_per_node=2", "parallel.tp=1", "parallel.pp=1",
        "data.source=file", f"data.path={tmp_path}/data/tiny_text_document",
        f"data.vocab_file={tmp_path}/tokenizer.json", f"launch.results_dir={results}",
    ])
    return plan_run(cfg, check(cfg), [], results)


def _probe(env_extra: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("NEOXLAB_RUN_DIR", "PYTHONPATH")}
    env.update(DS_ACCELERATOR="cpu", **env_extra)
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                          text=True, timeout=120, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(200)
def test_shim_installs_the_patch_when_deepspeed_is_imported(tmp_path):
    run_dir = _plan(tmp_path, _fake_checkout(tmp_path))
    shim_path = f"{SHIM_DIR}:{REPO_ROOT / 'src'}"
    seen = _probe({"PYTHONPATH": shim_path, "NEOXLAB_RUN_DIR": str(run_dir)})
    assert seen["torch_patched"] and seen["deepspeed_patched"]
    assert seen["policies"]["dp"] == "zfp(rate=8)" and seen["policies"]["tp"] == "zfp(rate=24)"
    without = _probe({"PYTHONPATH": shim_path})
    assert without == {"inject_loaded_at_start": False, "torch_patched": False,
                       "deepspeed_patched": False, "policies": None}


@pytest.mark.timeout(60)
def test_shim_still_runs_the_environments_own_sitecustomize(tmp_path):
    other = tmp_path / "site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['SITE_RAN'] = 'yes'\n")
    env = {k: v for k, v in os.environ.items() if k != "NEOXLAB_RUN_DIR"}
    env["PYTHONPATH"] = f"{SHIM_DIR}:{other}"
    code = ("import os, sys; "
            "print(os.environ.get('SITE_RAN'), sys.modules['sitecustomize'].__file__)")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=30)
    ran, first = proc.stdout.split()
    assert ran == "yes" and first == str(SHIM_DIR / "sitecustomize.py")


@pytest.mark.timeout(300)
def test_ranks_run_train_py_without_deepy_under_mpiexec(tmp_path):
    neox_dir = _fake_checkout(tmp_path)
    assert not (neox_dir / "deepy.py").exists()
    run_dir = _plan(tmp_path, neox_dir)
    cfg = compose_experiment("local_zhybrid", ["engine=neox"])  # only the command's shape
    out = tmp_path / "fake_out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(rank_env(_loaded(run_dir), run_dir), DS_ACCELERATOR="cpu",
               FAKE_NEOX_OUT=str(out), OMP_NUM_THREADS="1")
    mpiexec = str(Path(sys.executable).with_name("mpiexec"))
    command = [mpiexec, "-n", "2", *rank_command(cfg, run_dir, sys.executable)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240,
                          cwd=tmp_path, start_new_session=True)
    logs = "".join(p.read_text() for p in sorted((run_dir / "logs").glob("rank*.log")))
    assert proc.returncode == 0, proc.stderr[-2000:] + logs[-4000:]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"

    seen = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    neox_yml = yaml.safe_load((run_dir / "neox.yml").read_text())
    for rank, record in enumerate(seen):
        assert record["argv"][0] == str(neox_dir / "train.py")
        assert record["argv"][1] == "--megatron_config"
        assert {k: record["config"][k] for k in neox_yml} == neox_yml
        assert record["config"]["user_script"] == str(neox_dir / "train.py")
        env_seen = record["env"]
        assert env_seen["RANK"] == str(rank) and env_seen["WORLD_SIZE"] == "2"
        assert env_seen["LOCAL_RANK"] == str(rank)  # one host, no GPU: node-local rank
        # mpiexec's (hydra's) own local rank agrees with it, as DeepSpeed requires
        assert env_seen["MPI_LOCALRANKID"] == env_seen["NEOXLAB_NODE_LOCAL_RANK"] == str(rank)
        assert env_seen["NEOXLAB_RUN_DIR"] == str(run_dir.resolve())
        assert record["cwd"] == str(neox_dir)
        assert record["torch_patched"] and record["deepspeed_patched"]
        assert record["max_abs_error"] < 0.05  # zfp rate 8 on values in [3, 5]
        assert not record["megatron_preloaded"]
    assert seen[0]["env"]["MASTER_ADDR"] == seen[1]["env"]["MASTER_ADDR"]

    comm = [json.loads(line) for line in (run_dir / "comm.jsonl").read_text().splitlines()]
    reduced = [r for r in comm if r["dim"] == "dp" and r["op"] == "all_reduce"]
    assert sorted(r["rank"] for r in reduced) == [0, 1]
    for row in reduced:
        assert row["calls"] == 1  # one install: the shim's hook and the entry did not stack
        assert row["bytes_in"] == 4096 * 4 and row["bytes_out"] < row["bytes_in"] / 2

    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 1 and metrics[0]["step"] == 1 and metrics[0]["loss"] == 5.5
    global_batch = 1 * 4 * 2  # micro 1 x accum 4 (configs/parallel/tp2_pp2.yaml) x dp 2
    assert metrics[0]["samples_per_s"] == pytest.approx(global_batch / 0.5)
    provenance = json.loads((run_dir / "neox_provenance.json").read_text())
    assert provenance["neox_dir"] == str(neox_dir) and provenance["commit"] is None


@pytest.mark.timeout(300)
def test_a_bare_exit_fails_the_job_and_nobody_waits_at_a_barrier(tmp_path):
    """GPT-NeoX ends failed starts with exit() (code 0): rank 0 stops, rank 1 waits in its
    all-reduce. That must end as failed, with rank 0's reason, instead of hanging in the
    entry's barrier (or being recorded as completed)."""
    run_dir = _plan(tmp_path, _fake_checkout(tmp_path))
    out = tmp_path / "fake_out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(rank_env(_loaded(run_dir), run_dir), DS_ACCELERATOR="cpu",
               FAKE_NEOX_OUT=str(out), OMP_NUM_THREADS="1", FAKE_NEOX_BARE_EXIT_RANK="0")
    mpiexec = str(Path(sys.executable).with_name("mpiexec"))
    command = [mpiexec, "-n", "2", *rank_command(_loaded(run_dir), run_dir, sys.executable)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240,
                          cwd=tmp_path, start_new_session=True)
    status = json.loads((run_dir / "status.json").read_text())
    assert proc.returncode != 0 and status["state"] == "failed", status
    assert status["failed_rank"] == 0
    assert "before finishing its train_iters" in status["error"]
    assert "ERROR: Optimizer is None" in status["error"]  # the last lines of rank0.log
    assert not (out / "rank1.json").exists()  # rank 1 never got past its all-reduce
    assert not (run_dir / "metrics.jsonl").exists()


def _loaded(run_dir: Path):
    from neoxlab.run.rundir import load_config

    return load_config(run_dir)
