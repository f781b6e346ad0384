"""Every experiment file composes and validates; cluster-only ones plan without launching."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from neoxlab.commands import resume
from neoxlab.commands.cli import main
from neoxlab.config.compose import compose_experiment, list_experiments
from neoxlab.run import rundir
from tests.conftest import REPO_ROOT


@pytest.mark.parametrize("name", list_experiments())
def test_experiment_plans_without_launching(name, results_dir):
    code = main([f"experiment={name}", "launch.submit=false",
                 f"launch.results_dir={results_dir}"])
    assert code == 0
    cfg = compose_experiment(name)
    members = cfg.runs or [name]  # a comparison plans each member
    predicted = cfg.task.name == "predict"  # run dirs of predictions and tunes live apart
    root = results_dir / {"predict": "predictions", "tune": "tune"}.get(cfg.task.name, "")
    for member in members:
        (run_dir,) = (root / member).iterdir()
        status = json.loads((run_dir / "status.json").read_text())
        assert status["state"] == ("predicted" if predicted else "planned")
        config = json.loads((run_dir / "config.json").read_text())
        assert config["experiment"] == member
        assert (run_dir / "provenance.json").exists()
        assert (run_dir / "prediction.json").exists() == predicted


@pytest.mark.parametrize("args", [["--help"], ["experiment=local_3d", "-h"]])
def test_help_prints_usage_not_an_override_error(args, results_dir):
    # as a user types it (through __main__)
    proc = subprocess.run([sys.executable, "-m", "neoxlab", *args,
                           f"launch.results_dir={results_dir}"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("usage: python -m neoxlab"), proc.stdout
    for shown in ("--list", "resume <run_dir>", "experiment=local_3d", "examples:"):
        assert shown in proc.stdout, (shown, proc.stdout)
    assert "error" not in proc.stdout + proc.stderr
    assert not any(results_dir.rglob("*"))  # nothing planned


def test_unknown_experiment_lists_the_known_ones(capsys):
    assert main(["experiment=no_such_thing"]) == 2
    err = capsys.readouterr().err
    assert "no_such_thing" in err and "local_3d" in err


def test_cluster_experiment_is_not_submitted_without_its_scheduler(results_dir, capsys):
    code = main(["experiment=baseline_192gpu", f"launch.results_dir={results_dir}"])
    assert code == 2
    assert "bsub" in capsys.readouterr().err
    assert not any(results_dir.rglob("*"))


def test_local_slurm_not_running_names_the_fix(results_dir, capsys, monkeypatch, tmp_path):
    """As on a fresh clone: no Slurm clients on PATH (where CI started one, hidden here);
    `make run` and `make resume` both say how to start it."""

    assert main(["experiment=local_slurm", "launch.submit=false",  # a run dir to resume
                 f"launch.results_dir={results_dir}"]) == 0
    (planned,) = (results_dir / "local_slurm").iterdir()
    capsys.readouterr()
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    assert main(["experiment=local_slurm", f"launch.results_dir={results_dir}"]) == 2
    err = capsys.readouterr().err
    assert "local Slurm" in err and "sbatch is not on this machine" in err, err
    assert "`make slurm-up` (runs `bash .ci/slurm-up`" in err and "login node" not in err, err
    assert list((results_dir / "local_slurm").iterdir()) == [planned]  # refused before planning
    assert resume.main([str(planned)]) == 2
    err = capsys.readouterr().err
    assert "make slurm-up" in err and "login node" not in err, err


def test_run_dirs_are_never_reused(results_dir):
    for _ in range(2):
        assert main(["experiment=local_3d", "launch.submit=false",
                     f"launch.results_dir={results_dir}"]) == 0
    assert len(list((results_dir / "local_3d").iterdir())) == 2


def test_provenance_without_git_records_unknown(monkeypatch) -> None:
    """A machine without the git binary still plans runs: the commit is recorded unknown."""
    monkeypatch.setenv("PATH", "")
    assert rundir.git_state() == {"sha": None, "dirty": None}
