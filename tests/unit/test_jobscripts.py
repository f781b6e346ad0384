"""LSF and Slurm job scripts: golden files, the lines of each that matter stated by hand,
shellcheck, values that must not execute, and bad cluster input refused before anything is
planned or submitted."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from neoxlab.commands.check import check
from neoxlab.commands.cli import main
from neoxlab.commands.plan import plan_run
from neoxlab.config import ConfigError
from neoxlab.config.compose import compose_experiment
from neoxlab.files import REPO_ROOT
from neoxlab.launch import lsf
from neoxlab.launch.cluster_rules import machine_size_errors
from neoxlab.launch.jobscript import sanitize_job_name
from neoxlab.launch.schedulers import scheduler_of
from neoxlab.tasks import TASKS

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
PAPER_192 = ["baseline_192gpu", "naive_192gpu", "hybrid_192gpu", "mzhybrid_192gpu"]
CLUSTER_CONFIGS = sorted(p.stem for p in (REPO_ROOT / "configs/cluster").glob("*.yaml"))
CLUSTER_EXPERIMENTS = sorted(p.stem for p in (REPO_ROOT / "experiments").glob("*gpu.yaml"))


def rendered(tmp_path: Path, experiment: str, overrides: list[str] = ()) -> tuple[str, Path]:
    cfg = compose_experiment(experiment, [*overrides, "launch.submit=false"])
    run_dir = plan_run(cfg, check(cfg), root=tmp_path)
    script = scheduler_of(cfg).write_script(cfg, run_dir, TASKS[cfg.task.name].program)
    return script.read_text(), run_dir


def normalized(text: str, run_dir: Path) -> str:
    """Machine-specific paths become placeholders so the golden file is portable."""
    text = text.replace(str(run_dir.resolve()), "<RUN_DIR>").replace(run_dir.name, "<RUN_ID>")
    text = re.sub(r"\.\d{8}-\d{6}", ".<TIME>", text)  # the run's creation time in job names
    return text.replace(sys.executable, "<PYTHON>").replace(str(REPO_ROOT), "<REPO>")


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("NEOXLAB_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: review the output, NEOXLAB_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"rendered script differs from {path}"


@pytest.mark.parametrize("experiment", PAPER_192)
def test_lsf_scripts_of_the_192_gpu_runs_match_their_golden_files(tmp_path, experiment):
    text, run_dir = rendered(tmp_path, experiment)
    check_golden(f"lsf/{experiment}.lsf", normalized(text, run_dir))


def test_slurm_script_matches_its_golden_file(tmp_path):
    text, run_dir = rendered(tmp_path, "hybrid_192gpu", ["cluster=slurm", "cluster.account=proj1"])
    check_golden("slurm/hybrid_192gpu.sbatch", normalized(text, run_dir))


# The lines of each golden script that say what the job asks for and does (resources,
# logs, the time-limit warning and what it triggers, the rank launcher), written out here by
# hand: a golden file rewritten by NEOXLAB_UPDATE_GOLDEN=1 cannot change them unnoticed.
LSF_192_LINES = [
    "#BSUB -nnodes 48", "#BSUB -W 12:00", "#BSUB -q pbatch",
    "#BSUB -o <RUN_DIR>/logs/job.%J.out", "#BSUB -e <RUN_DIR>/logs/job.%J.err",
    "#BSUB -wa URG", "#BSUB -wt 5",  # URG 5 minutes before the limit
    "module load cuda/11.8.0", "module load gcc/8.3.1", "cd <REPO>",
    "export PYTHONPATH=<REPO>/src",
]
SLURM_192_LINES = [
    "#SBATCH --nodes=48", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
    "#SBATCH --cpus-per-task=10", "#SBATCH --time=12:00:00", "#SBATCH --partition=gpu",
    "#SBATCH --account=proj1",
    "#SBATCH --output=<RUN_DIR>/logs/job.%j.out", "#SBATCH --error=<RUN_DIR>/logs/job.%j.err",
    "#SBATCH --signal=B:USR1@300",  # USR1 to the batch shell only, 300 s before the limit
    "cd <REPO>", "export PYTHONPATH=<REPO>/src",
]
# the job's steps, in this order
LSF_192_STEPS = [
    "<PYTHON> -m neoxlab.launch.jobstep begin <RUN_DIR>",
    "source src/neoxlab/launch/templates/stop_on_signal.sh <RUN_DIR>/stop.request",
    "run_ranks jsrun -n 192 -r 4 -a 1 -c 10 -g 1 -b packed:10 -d packed \\",
    "  <PYTHON> -m neoxlab.engines.builtin <RUN_DIR> || code=$?",
    '<PYTHON> -m neoxlab.launch.jobstep end <RUN_DIR> "$code"',
    'exit "$code"',
]
SLURM_192_STEPS = [
    "<PYTHON> -m neoxlab.launch.jobstep begin <RUN_DIR>",
    "source src/neoxlab/launch/templates/stop_on_signal.sh <RUN_DIR>/stop.request",
    "run_ranks srun --mpi=pmi2 --kill-on-bad-exit=1 \\",
    "  <PYTHON> -m neoxlab.launch.pmi_relay <PYTHON> -m neoxlab.engines.builtin <RUN_DIR>"
    " || code=$?",
    '<PYTHON> -m neoxlab.launch.jobstep end <RUN_DIR> "$code"',
    'exit "$code"',
]


def assert_essential_lines(text: str, lines: list[str], steps: list[str], signal: str) -> None:
    """Every line present as a whole line, the steps in order, and the sourced handler
    turning the warning signal into the stop request."""
    have = text.splitlines()
    for line in lines + steps:
        assert line in have, f"missing line {line!r}"
    at = [have.index(step) for step in steps]
    assert at == sorted(at), f"steps out of order: {steps}"
    handler = (REPO_ROOT / steps[1].split()[1]).read_text()
    (trap,) = [line for line in handler.splitlines() if line.startswith("trap ")]
    assert signal in trap.split("'")[-1].split() and 'touch "$neoxlab_stop_file"' in trap


@pytest.mark.parametrize("experiment", PAPER_192)
def test_lsf_scripts_of_the_192_gpu_runs_say_what_their_golden_files_say(tmp_path, experiment):
    text, run_dir = rendered(tmp_path, experiment)
    text = normalized(text, run_dir)
    assert_essential_lines(text, [f"#BSUB -J {experiment}.<TIME>", *LSF_192_LINES],
                           LSF_192_STEPS, "URG")


def test_slurm_script_says_what_its_golden_file_says(tmp_path):
    text, run_dir = rendered(tmp_path, "hybrid_192gpu", ["cluster=slurm", "cluster.account=proj1"])
    text = normalized(text, run_dir)
    assert_essential_lines(text, ["#SBATCH --job-name=hybrid_192gpu.<TIME>", *SLURM_192_LINES],
                           SLURM_192_STEPS, "USR1")


def test_lsf_resources_follow_the_cluster_config(tmp_path):
    text, _ = rendered(tmp_path, "hybrid_192gpu", ["cluster.account=mybank"])
    assert "#BSUB -nnodes 48\n" in text and "#BSUB -W 12:00\n" in text
    assert "#BSUB -G mybank\n" in text and "#BSUB -q pbatch\n" in text
    # 48 nodes x 4 GPUs: one resource set per GPU, 1 task, 40 cores / 4 = 10 cores each
    assert "jsrun -n 192 -r 4 -a 1 -c 10 -g 1 -b packed:10" in text
    assert "-m neoxlab.engines.builtin" in text


def test_slurm_resources_follow_the_cluster_config(tmp_path):
    text, _ = rendered(tmp_path, "hybrid_64gpu", ["cluster=slurm", "cluster.nodes=16",
                                                  "cluster.mpi=pmix"])
    for line in ("#SBATCH --nodes=16", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --cpus-per-task=10", "#SBATCH --time=12:00:00",
                 "#SBATCH --partition=gpu"):
        assert line + "\n" in text
    assert "srun --mpi=pmix" in text and "#SBATCH --account" not in text


@pytest.mark.skipif(shutil.which("shellcheck") is None,
                    reason="shellcheck not installed (.ci/run installs it)")
@pytest.mark.parametrize("experiment", CLUSTER_EXPERIMENTS)
@pytest.mark.parametrize("cluster", ["lassen", "slurm"])
def test_every_rendered_script_is_shellcheck_clean(tmp_path, experiment, cluster):
    text, run_dir = rendered(tmp_path, experiment, [f"cluster={cluster}", "cluster.nodes=48"])
    script = run_dir / "job.sh"
    script.write_text(text)
    # -x follows the job's `source src/neoxlab/launch/templates/stop_on_signal.sh` (from the
    # repo root, as the job does)
    out = subprocess.run(["shellcheck", "-x", "-s", "bash", str(script)], cwd=REPO_ROOT,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout


HOSTILE = ["$(touch {m})", "`touch {m}`", "x; touch {m}", "x\ntouch {m}", "x' ; touch {m}; '"]


def test_config_values_in_scripts_cannot_execute(tmp_path):
    """Run the rendered script with stand-in module/jsrun: every value arrives as text. All
    the hostile values go into one script (one module line and one variable each), so its
    two `jobstep` steps start a Python process twice, not twice per value."""
    values = [template.format(m=tmp_path / f"pwned{i}") for i, template in enumerate(HOSTILE)]
    cfg = compose_experiment("local_3d", ["cluster=lassen", "cluster.nodes=2",
                                          "cluster.device=cpu", "launch.submit=false"])
    cfg.cluster.modules = list(values)
    cfg.cluster.activate = str(tmp_path / "activate")
    cfg.cluster.env = {f"HOSTILE{i}": value for i, value in enumerate(values)}
    run_dir = plan_run(cfg, check(cfg), root=tmp_path)
    (tmp_path / "activate").write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "seen"
    # `module load <value>`, one call per value in order: each call writes its own file
    (bin_dir / "module").write_text(
        f'#!/bin/bash\nn=$(find {tmp_path} -maxdepth 1 -name "seen.module.*" | wc -l)\n'
        f'printf %s "$2" > {seen}.module."$n"\n')
    (bin_dir / "jsrun").write_text("#!/bin/bash\n" + "".join(
        f'printf %s "$HOSTILE{i}" > {seen}.env.{i}\n' for i in range(len(values))))
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    script = lsf.write_script(cfg, run_dir, TASKS[cfg.task.name].program)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "LSB_MCPU_HOSTS": "batch1 1 node1 40", "LSB_JOBID": "7"}
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    for i, value in enumerate(values):
        assert not (tmp_path / f"pwned{i}").exists(), value
        assert Path(f"{seen}.module.{i}").read_text() == value
        assert Path(f"{seen}.env.{i}").read_text() == value


@pytest.mark.parametrize("field", ["cluster.queue", "cluster.account"])
@pytest.mark.parametrize("value", ["'a;b'", "'a b'", "'$(id)'"])
def test_directive_values_must_be_plain_tokens(field, value):
    cfg = compose_experiment("hybrid_192gpu", [f"{field}={value}", "launch.submit=false"])
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        check(cfg)


def test_job_names_are_sanitized():
    assert sanitize_job_name("exp;rm -rf /$(x)") == "exp_rm_-rf_x"
    assert sanitize_job_name("\n") == "neoxlab"
    assert len(sanitize_job_name("a" * 300)) == 64


@pytest.mark.parametrize(("overrides", "needle"), [
    (["cluster.walltime=12h"], "cluster.walltime='12h' is not a lsf time limit"),
    (["cluster.walltime=1:75"], "cluster.walltime='1:75'"),
    (["cluster=slurm", "cluster.walltime=12:00:00:00"], "not a slurm time limit"),
    (["cluster.ranks_per_node=8", "cluster.nodes=24"], "more GPUs than a lassen node has"),
    (["cluster.launcher=srun"], "cluster.launcher='srun' does not go with scheduler 'lsf'"),
    (["cluster=slurm", "cluster.mpi=openmpi"], "cluster.mpi='openmpi'"),
    (["launch.rank_start=spawn"], "launch.rank_start='spawn' is not one of"),
    (["cluster.nodes=100000"], "cluster.nodes=100000 (400000 GPUs) is more than lassen has: "
                               "cluster.max_nodes=795 (3180 GPUs); ask for at most 795 nodes"),
    (["cluster.max_nodes=0"], "cluster.max_nodes=0 must be >= 1"),
])
def test_bad_cluster_input_is_refused_before_planning(tmp_path, capsys, overrides, needle):
    code = main(["experiment=hybrid_192gpu", *overrides, f"launch.results_dir={tmp_path}"])
    assert code == 2
    assert needle in capsys.readouterr().err
    assert not any(tmp_path.rglob("*"))


@pytest.mark.parametrize("name", CLUSTER_CONFIGS)
def test_each_cluster_config_states_the_machine_size(name):
    # an explicit key (a number, or null where the site decides), not the schema's default
    text = (REPO_ROOT / "configs/cluster" / f"{name}.yaml").read_text()
    assert re.search(r"^max_nodes: (\d+|null)  # ", text, re.M), name


def test_machine_size_bounds_the_nodes_only_where_known():
    lassen = compose_experiment("hybrid_192gpu", ["launch.submit=false"]).cluster
    lassen.nodes = lassen.max_nodes
    assert machine_size_errors(lassen) == []
    lassen.nodes += 1
    (error,) = machine_size_errors(lassen)
    assert f"cluster.nodes={lassen.nodes}" in error
    site = compose_experiment("hybrid_192gpu", ["cluster=slurm", "cluster.nodes=100000",
                                                "launch.submit=false"]).cluster
    assert site.max_nodes is None and machine_size_errors(site) == []


def test_unknown_cluster_names_the_known_ones(tmp_path, capsys):
    assert main(["experiment=hybrid_192gpu", "cluster=lasen", "launch.submit=false",
                 f"launch.results_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "lasen" in err and "lassen" in err and "slurm_local" in err


def test_missing_submit_command_submits_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(["experiment=hybrid_192gpu", "cluster=slurm",
                 f"launch.results_dir={tmp_path}"]) == 2
    assert "sbatch" in capsys.readouterr().err and not any(tmp_path.rglob("*"))


def test_submit_false_renders_and_prints_the_script_path(tmp_path, capsys):
    assert main(["experiment=hybrid_192gpu", "launch.submit=false",
                 f"launch.results_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    (script,) = tmp_path.glob("hybrid_192gpu/*/job.lsf")
    assert f"job script: {script}" in out
    assert not (tmp_path / "manifests").exists()
