"""`python -m neoxlab experiment=<name> [overrides]`: compose -> validate -> plan -> launch."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from neoxlab import rundir
from neoxlab.compose import compose_experiment, list_experiments
from neoxlab.config import Config, ConfigError
from neoxlab.layout import resolve_layout
from neoxlab.plan import plan_run

DEFAULT_EXPERIMENT = "local_compare"
SUBMIT_COMMANDS = {"lsf": "bsub", "slurm": "sbatch"}


def split_args(args: list[str]) -> tuple[str, list[str]]:
    """Pull `experiment=<name>` out of the Hydra overrides."""
    name, rest = DEFAULT_EXPERIMENT, []
    for arg in args:
        if arg.startswith("experiment="):
            name = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return name, rest


def check_scheduler(cfg: Config) -> None:
    """Refuse before planning when the job cannot be submitted from this machine."""
    scheduler = cfg.cluster.scheduler
    if cfg.cluster.emulated is not None:  # namespaces on this machine: root, ip, a fit
        from neoxlab.launch.emulated import preflight

        preflight(cfg)
    if scheduler == "local" or not cfg.launch.submit:
        return
    command = SUBMIT_COMMANDS[scheduler]
    if shutil.which(command) is None:
        raise ConfigError(
            f"cluster '{cfg.cluster.name}' submits with {command} ({scheduler}), which is not "
            f"on this machine; run from the cluster's login node, or add launch.submit=false "
            "to render the job script only"
        )
    if cfg.engine.name == "neox":
        from neoxlab.neox.validate import check_neox_inputs

        problems = check_neox_inputs(cfg)
        if problems:
            raise ConfigError("; ".join(problems))


def run_comparison(cfg: Config, overrides: list[str], argv: list[str]) -> int:
    """Validate every member first (nothing starts on a bad one), then run them in order."""
    from neoxlab.compare import format_table, member_row

    members = [compose_experiment(name, overrides) for name in cfg.runs]
    for member in members:
        resolve_layout(member)
        check_scheduler(member)
    rows, worst = [], 0
    ran_here = all(m.cluster.scheduler == "local" and m.launch.submit for m in members)
    for member in members:
        print(f"[neoxlab] === {member.experiment} ===", flush=True)
        code, run_dir = run_one(member, argv, overrides)
        worst = worst or code
        if ran_here:
            rows.append(member_row(member.experiment, run_dir))
    if not ran_here:  # submitted or only planned: results come later (`make status`)
        return worst
    print(format_table(rows), flush=True)
    return worst or draw_figures(cfg)


def draw_figures(cfg: Config) -> int:
    """Tables and figures of the runs just made (the newest run of each member)."""
    from neoxlab import collect, figures

    results = Path(cfg.launch.results_dir)
    collect.collect(cfg.experiment, results, latest=True)
    code = figures.main(["--exp", cfg.experiment, "--results", str(results)])
    table = "serve.csv" if cfg.task.name == "serve" else "summary.md"
    print(f"[neoxlab] figures: {results}/figures/{cfg.experiment}.*.png|pdf, "
          f"table: {results}/tables/{cfg.experiment}.{table}", flush=True)
    return code


def run_one(cfg: Config, argv: list[str], overrides: list[str]) -> tuple[int, Path]:
    resolve_layout(cfg)  # every rule first, then whether this machine can submit
    check_scheduler(cfg)
    run_dir = plan_run(cfg, argv)
    print(f"[neoxlab] run dir: {run_dir}", flush=True)
    if cfg.cluster.scheduler != "local":
        return submit_job(cfg, run_dir, overrides), run_dir
    if not cfg.launch.submit:
        print("[neoxlab] launch.submit=false: validated and planned, nothing started", flush=True)
        return 0, run_dir
    from neoxlab.launch import local

    record_run(cfg, run_dir, overrides, job_id=None)
    code = local.launch(cfg, run_dir)
    report(run_dir)
    return code, run_dir


def submit_job(cfg: Config, run_dir: Path, overrides: list[str]) -> int:
    """Render the job script into the run dir; submit it unless launch.submit=false."""
    from neoxlab.launch import scheduler_module

    scheduler = scheduler_module(cfg.cluster.scheduler)
    script = scheduler.write_script(cfg, run_dir)
    print(f"[neoxlab] job script: {script}", flush=True)
    if not cfg.launch.submit:
        print("[neoxlab] launch.submit=false: job script rendered, nothing submitted",
              flush=True)
        return 0
    try:
        job_id = scheduler.submit(script)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        rundir.set_status(run_dir, "failed", error=f"submission failed: {exc}")
        print(f"[neoxlab] error: {exc}", file=sys.stderr)
        return 1
    rundir.set_status(run_dir, "submitted", job_id=job_id)
    record_run(cfg, run_dir, overrides, job_id=job_id)
    print(f"[neoxlab] submitted {cfg.cluster.scheduler} job {job_id}; "
          f"`make status EXP={cfg.experiment}` shows its state", flush=True)
    return 0


def record_run(cfg: Config, run_dir: Path, overrides: list[str], job_id: str | None) -> None:
    from neoxlab.launch import manifest

    manifest.record_job(run_dir, cfg, job_id, overrides=overrides)


def report(run_dir: Path) -> None:
    status = rundir.read_json(run_dir / "status.json")
    line = f"[neoxlab] {status['state']}: {run_dir}"
    if status["state"] == "failed":
        line += f"\n[neoxlab] rank {status.get('failed_rank')}: {status.get('error')}"
    if status["state"] in ("failed", "preempted") and (run_dir / "checkpoints").is_dir():
        line += f"\n[neoxlab] continue it from its last checkpoint: make resume RUN={run_dir}"
    summary_path = run_dir / "summary.json"
    s = rundir.read_json(summary_path) if summary_path.exists() else {}
    if s.get("median_samples_per_s") is not None:
        line += (
            f"\n[neoxlab] {s['steps']} steps, final loss {s['final_loss']:.4f}, median "
            f"{s['median_samples_per_s']:.2f} samples/s, "
            f"{s['median_tflops_per_gpu']:.4g} TFLOPS/GPU (steady steps)"
        )
    print(line, flush=True)


def main(args: list[str] | None = None) -> int:
    args = sys.argv[1:] if args is None else args
    if args in (["--list"], ["list"]):
        print("\n".join(list_experiments()))
        return 0
    name, overrides = split_args(args)
    try:
        cfg = compose_experiment(name, overrides)
        argv = ["python", "-m", "neoxlab", *args]
        if cfg.task.name == "predict":  # the performance model instead of a launch
            from neoxlab.perfmodel.task import run_predict

            return run_predict(cfg, overrides, argv)
        if cfg.runs:
            return run_comparison(cfg, overrides, argv)
        code, _ = run_one(cfg, argv, overrides)
        ran_here = cfg.cluster.scheduler == "local" and cfg.launch.submit
        if code == 0 and ran_here and cfg.task.name == "serve":
            return draw_figures(cfg)  # a serve run is the whole experiment: draw it now
        return code
    except ConfigError as exc:
        print(f"[neoxlab] error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
