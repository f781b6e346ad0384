"""Time from `python -m neoxlab experiment=local_3d` to the first training step, by phase.

    python bench/startup.py [--vary rank_start|prestart|wandb] [--quick] [--rounds 2]
                            [--steps 30]

Why: `make run` is the researcher's inner loop; start-up dominates short local runs, and
the phases say where to cut. After one untimed warm-up run (page cache), each round runs
the real entry point twice, back to back, in two modes (the order alternates by round), so
their difference is the cost of one choice under the same machine load:
  --vary rank_start  ranks exec'd (a fresh interpreter each) vs forked from the fork server
                     (launch.rank_start; wandb disabled in both)
  --vary prestart    the same command line through neoxlab.commands.cli (no spare fork server)
                     vs `python -m neoxlab` (a spare started before the launcher's imports)
  --vary wandb       wandb disabled vs offline (the default)
Phases, all wall clock on this host:

  compose+plan   process start -> "[neoxlab] run dir:" printed (Python, imports, Hydra
                 compose, validation, run dir with frozen configs and provenance)
  ranks up       -> logs/rank0.pid (mpiexec, 8 interpreters, mpi4py, rank discovery)
  to 1st step    -> start of step 1 on rank 0 (torch/DeepSpeed imports, init distributed,
                 model and engine build, data, metrics/progress/wandb set-up)
  1st step       step 1 itself (first-call warm-up)
  total          process start -> end of step 1 (rank 0's metrics.jsonl "time" field)
  exit           end of the last step -> the command returns (teardown)

Steady samples/s is summary.json's median over steady steps (warm-up steps excluded).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from neoxlab.run import rundir

ENTRY = ["-m", "neoxlab"]  # __main__: prestarts a spare fork server
CLI_ONLY = ["-c", "import sys; from neoxlab.commands.cli import main; sys.exit(main(sys.argv[1:]))"]
NO_WANDB = ["logger.wandb=disabled"]
# mode -> (interpreter arguments, overrides)
MODES = {
    "rank_start": {"exec": (ENTRY, ["launch.rank_start=exec", *NO_WANDB]),
                   "forkserver": (ENTRY, ["launch.rank_start=forkserver", *NO_WANDB])},
    "prestart": {"cli": (CLI_ONLY, NO_WANDB), "spare": (ENTRY, NO_WANDB)},
    "wandb": {"disabled": (ENTRY, NO_WANDB), "offline": (ENTRY, ["logger.wandb=offline"])},
}
RUN_DIR_PREFIX = "[neoxlab] run dir: "


def run_once(steps: int, mode: tuple[list[str], list[str]], results: Path,
             timeout: int) -> dict[str, float]:
    """Run the entry point once; phase times in seconds and steady samples/s."""
    entry, overrides = mode
    cmd = [sys.executable, *entry, "experiment=local_3d", f"train.steps={steps}",
           *overrides, f"launch.results_dir={results}"]
    log = results / f"bench-{time.time():.3f}.log"
    t0 = time.time()
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        planned, run_dir = None, None
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(RUN_DIR_PREFIX) and run_dir is None:
                planned, run_dir = time.time(), Path(line[len(RUN_DIR_PREFIX):].strip())
        code = proc.wait(timeout=timeout)
    t_end = time.time()
    if code != 0 or run_dir is None or planned is None:
        raise RuntimeError(f"{' '.join(cmd)} exited {code}; see {log}")
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first, last = records[0], records[-1]
    ranks_up = (run_dir / "logs" / "rank0.pid").stat().st_mtime
    step1_start = first["time"] - first["iteration_s"]
    summary = rundir.read_json(run_dir / "summary.json")
    return {
        "compose+plan": planned - t0,
        "ranks up": ranks_up - planned,
        "to 1st step": step1_start - ranks_up,
        "1st step": first["iteration_s"],
        "total": first["time"] - t0,
        "exit": t_end - last["time"],
        "samples/s": summary["median_samples_per_s"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vary", choices=list(MODES), default="rank_start",
                    help="the choice compared (default: rank_start)")
    ap.add_argument("--quick", action="store_true", help="1 round of 10 steps")
    ap.add_argument("--rounds", type=int, default=2, help="rounds (each runs every mode)")
    ap.add_argument("--steps", type=int, default=30, help="training steps per run")
    ap.add_argument("--no-warmup", action="store_true", help="skip the untimed first run")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run")
    ap.add_argument("--results-dir", type=Path, default=None,
                    help="where run dirs go (default: a new temp dir)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.steps = 1, 10
    results = args.results_dir or Path(tempfile.mkdtemp(prefix="neoxlab-bench-"))
    results.mkdir(parents=True, exist_ok=True)
    print(f"[bench] reproduce: python bench/startup.py {' '.join(sys.argv[1:])}".rstrip())
    print(f"[bench] run dirs under {results}", flush=True)
    modes = MODES[args.vary]
    names = list(modes)
    if not args.no_warmup:  # untimed: fills the page cache, so round 1 is not the cold one
        run_once(2, modes[names[0]], results, args.timeout)
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in names}
    for r in range(args.rounds):
        for mode in names if r % 2 == 0 else names[::-1]:  # ABBA: drift hits both modes
            runs[mode].append(run_once(args.steps, modes[mode], results, args.timeout))
            total = runs[mode][-1]["total"]
            print(f"[bench] round {r + 1} {args.vary}={mode}: first step done at {total:.1f} s",
                  flush=True)
    keys = list(runs[names[0]][0])
    med = {m: {k: statistics.median(x[k] for x in runs[m]) for k in keys} for m in names}
    a, b = names
    print(f"\nstart-up of local_3d (8 ranks, TP2 PP2 DP2, ZeRO-1), {args.steps} steps, median "
          f"of {args.rounds} round(s), modes interleaved")
    print(f"{'phase':14s} " + " ".join(f"{args.vary + '=' + m:>22s}" for m in names)
          + f" {b + ' - ' + a:>22s}")
    for k in keys:
        unit = "" if k == "samples/s" else " s"
        cells = " ".join(f"{med[m][k]:20.2f}{unit:2s}" for m in names)
        print(f"{k:14s} {cells} {med[b][k] - med[a][k]:+20.2f}{unit:2s}")
    for m in names:
        totals = " ".join(f"{x['total']:.1f}" for x in runs[m])
        print(f"time to first step, each run, {args.vary}={m}: {totals} s")
    ratio = med[a]["total"] / med[b]["total"]
    print(f"time to first step, {a} / {b}: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
