"""One point of the emulated sweep, run for real: a run of experiment emulated_sweep with a
compression config at an uplink rate, and the tuner's pick for a point (task=tune, predicted
only). Both start `python -m neoxlab` as a user would, so this module sits with the
studies that drive it (emulated_sweep.py, tune_regret.py), above every command."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

from sweep_runs import LAYOUTS, TUNED, Pick, Run, measure, rows_of

from neoxlab.files import REPO_ROOT
from neoxlab.perfmodel.stretch import Sampler, during_steps, steady_window


def neoxlab(cmd: list[str]) -> None:
    """Run a `python -m neoxlab` command from the repository; its output's tail on failure."""
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def run_point(compression: str, rate: str, layout: str, *, model: str, steps: int,
              results: Path) -> Run:
    """One run of experiment emulated_sweep with a compression config at an uplink rate
    ("none": unshaped), measured, with the load of other jobs during its steady steps."""
    cmd = [sys.executable, "-m", "neoxlab", "experiment=emulated_sweep",
           f"compression={compression}", f"model={model}", f"train.steps={steps}",
           f"cluster.emulated.inter.rate_mbit={'null' if rate == 'none' else rate}",
           f"launch.results_dir={results}", *LAYOUTS[layout]]
    with Sampler("neoxlab.engines.builtin", interval=0.05) as sampler:
        neoxlab(cmd)
    run_dir = sorted((results / "emulated_sweep").iterdir())[-1]
    records = rows_of(run_dir / "metrics.jsonl")
    window = steady_window(records, 2)
    whole = sampler.load(*window)
    return Run(run_dir, measure(run_dir), {
        "external": during_steps(sampler, records, 2, 2),
        "external_whole_steps": whole and whole.external(2),
        "others_cores": sampler.others_cpu(*window)})


def tuned_name(layout: str, rate: str) -> str:
    return f"tuned_sweep_{layout.replace('-', '_')}_{rate}"


def tune_point(rate: str, layout: str, *, model: str, results: Path,
               extra: tuple[str, ...] = (), measure: bool = True) -> Pick:
    """task=tune for the layout at the rate, with the tuner's defaults (tune.measure=true:
    capture, noise runs and probes inside the emulated cluster; `measure=False`: predicted
    only, proxy on stand-ins, no probes); its pick is copied to
    configs/compression/<tuned_name>.yaml (a git-ignored name) so every later run of the
    point runs it as `compression=<name>`."""
    name = tuned_name(layout, rate)
    cmd = [sys.executable, "-m", "neoxlab", "experiment=tune_emulated", f"model={model}",
           f"cluster.emulated.inter.rate_mbit={'null' if rate == 'none' else rate}",
           f"tune.measure={str(measure).lower()}", f"launch.results_dir={results}",
           *LAYOUTS[layout], *extra]
    neoxlab(cmd)
    tune_dir = sorted((results / "tune" / "tune_emulated").iterdir())[-1]
    summary = json.loads((tune_dir / "tune.json").read_text())
    chosen = Path(summary["config"])
    text = chosen.read_text().replace(chosen.stem, name)  # its scheme and its run line
    (REPO_ROOT / "configs" / "compression" / f"{name}.yaml").write_text(text)
    with (results / "tables" / "tune_emulated.tune.csv").open() as f:
        fixed = {r["label"]: float(r["predicted_step_s"]) for r in csv.DictReader(f)
                 if r["kind"] == "fixed" and r["predicted_step_s"]}
    return Pick(name, tune_dir, {TUNED: summary["chosen_step_s"], **fixed},
                summary.get("chosen_uplink_payload_bytes_per_step"))
