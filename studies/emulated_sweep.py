"""The four schemes on emulated nodes, side by side at each inter-node rate: samples/s and
TFLOPS/GPU per scheme, gain over baseline, the measured communication share of a step and
what the uplinks carried; every point is the median run of --repeats runs (default 1) of
experiment emulated_sweep, the spread of samples/s over them kept beside it.

Needs root + iproute2; run it alone (it is heavy, about 15 minutes with the defaults):
    .venv/bin/python studies/emulated_sweep.py --rates none 1000 200 40 10
    .venv/bin/python studies/emulated_sweep.py --repeats 3 --rates none 300 200 80 40
    .venv/bin/python studies/emulated_sweep.py --layout 4x1 --rates none 40
    .venv/bin/python studies/emulated_sweep.py --layout 4x1-owner --rates 200 40
Appends to results/tables/emulated_sweep.sweep.csv (a row per layout, rate and scheme; a
point measured again replaces its row), then `make figures EXP=emulated_sweep` draws it.

comm share: the accounted time of the training collectives (all-reduce, reduce(-scatter),
all-gather, all-to-all; start-up broadcasts left out) per rank over the run's summed step
times. `external`: other jobs' threads competing for the cores while the ranks ran their
steady steps (perfmodel.stretch), the input the performance model takes for a shared
machine; `external_whole_steps`: the same taken over whole steps (it counts the ranks' own
bursts as other jobs' threads), and `others_cores`: cores busy with anything but our
processes (/proc/stat), kept beside it as the check.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from neoxlab.emulated.sweep import (
    LAYOUTS,
    SCHEMES,
    TABLE,
    Run,
    measure,
    point_rows,
    read_jsonl,
    write,
)
from neoxlab.perfmodel.stretch import Sampler, during_steps, steady_window

REPO = Path(__file__).resolve().parents[1]


def run(scheme: str, rate: str, layout: str, args) -> tuple[Path, dict]:
    """One sweep point; the run dir and the load of other jobs during its steady steps."""
    cmd = [sys.executable, "-m", "neoxlab", "experiment=emulated_sweep",
           f"compression={scheme}", f"model={args.model}", f"train.steps={args.steps}",
           f"cluster.emulated.inter.rate_mbit={'null' if rate == 'none' else rate}",
           f"launch.results_dir={args.results}", *LAYOUTS[layout]]
    with Sampler("neoxlab.engines.builtin", interval=0.05) as sampler:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    run_dir = sorted((args.results / "emulated_sweep").iterdir())[-1]
    records = read_jsonl(run_dir / "metrics.jsonl")
    window = steady_window(records, 2)
    whole = sampler.load(*window)
    return run_dir, {"external": during_steps(sampler, records, 2, 2),
                     "external_whole_steps": whole and whole.external(2),
                     "others_cores": sampler.others_cpu(*window)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", nargs="+", default=["none", "1000", "200", "40", "10"],
                        help="inter-node Mbit/s per node and direction; none: unshaped")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="2x2")
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES))
    parser.add_argument("--steps", type=int, default=5, help="2 warm-up steps + the median's")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per point, interleaved (every rate and scheme once, then "
                        "again); a point is its median run")
    parser.add_argument("--model", default="neox_small")
    parser.add_argument("--results", type=Path, default=REPO / "results")
    args = parser.parse_args()
    args.results = args.results.resolve()
    runs: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for repeat in range(1, args.repeats + 1):
        for rate in args.rates:
            for scheme in args.schemes:
                run_dir, load = run(scheme, rate, args.layout, args)
                runs[rate, scheme].append(Run(run_dir, measure(run_dir), load))
                m = runs[rate, scheme][-1].metrics
                print(f"{args.layout} {rate:>5} {scheme:<9} run {repeat}/{args.repeats} "
                      f"{m['samples_per_s']:7.3f} samples/s  comm {m['comm_share']:4.0%}  "
                      f"codec {m['codec_share']:4.0%}  uplinks {m['uplink_MB_per_step']:6.2f} "
                      f"MB/step  external {load['external'] or 0:.1f} (whole steps "
                      f"{load['external_whole_steps'] or 0:.1f}, others' CPU "
                      f"{load['others_cores'] or 0:.2f} cores)  loss {m['final_loss']:.4f}",
                      flush=True)
            rows = point_rows(args.layout, rate, args.schemes, runs)
            write(rows, args.results / TABLE)
            print("  ".join(f"{r['scheme']} {r['gain_samples']:+.1%}" for r in rows[1:])
                  + f"  (gains of the median runs, {len(runs[rate, args.schemes[0]])} per "
                  "point)", flush=True)
    print(f"table: {args.results / TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
