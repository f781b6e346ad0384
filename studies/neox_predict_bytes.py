"""Bytes per dimension of a real run against what the performance model predicts for it.

`python studies/neox_predict_bytes.py <run_dir> [--json out.json]` reads an uncompressed
run's comm.jsonl (every rank, every call, summed per dimension over the run) and sets it
beside the model's messages for the run's layout (perfmodel.traffic.messages, counted as the
comm accounting records a call: perfmodel.wire_bytes.accounted_call, every rank of every
group of the dimension, per step x steps). Point-to-point rows are counted on the sending
side only (the accounting records both a send and its recv). Built for engine=neox runs
(docs/measurements/2026-12-07-neox-cpu.md); works on builtin runs too.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from neoxlab.layout import resolve_layout
from neoxlab.perfmodel import traffic
from neoxlab.perfmodel.topology import groups
from neoxlab.perfmodel.wire_bytes import accounted_call
from neoxlab.run.rundir import load_config

DIMS = ("dp", "zero", "tp", "pp")


def measured(run_dir: Path) -> dict[str, dict[str, float]]:
    """dim -> op -> bytes sent (recv rows left out: their send is counted)."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for line in (run_dir / "comm.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["op"] != "recv":
            out[row["dim"]][row["op"]] += row["bytes_in"]
    return out


def predicted(run_dir: Path, steps: int) -> dict[str, dict[str, float]]:
    cfg = load_config(run_dir)
    layout = resolve_layout(cfg)
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for msg in traffic.messages(cfg, layout):
        op, nbytes, calls = accounted_call(msg, 1.0, cfg.compression.allreduce)
        per_step = msg.count * calls * (layout.grad_accum if msg.per == "microbatch" else 1)
        for group in groups(layout, msg.dim):
            out[msg.dim][op] += len(group) * nbytes * per_step * steps
    return out


def compare(run_dir: Path) -> list[dict]:
    steps = len((run_dir / "metrics.jsonl").read_text().splitlines())
    real, model = measured(run_dir), predicted(run_dir, steps)
    rows = []
    for dim in (*DIMS, *sorted(set(real) - set(DIMS))):
        r, m = sum(real[dim].values()), sum(model[dim].values())
        rows.append({"dim": dim, "measured_bytes": r, "predicted_bytes": m,
                     "measured_over_predicted": r / m if m else None,
                     "measured_by_op": dict(real[dim]), "predicted_by_op": dict(model[dim]),
                     "steps": steps})
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = compare(args.run_dir.resolve())
    print(f"{'dim':6} {'measured MB':>12} {'predicted MB':>13} {'ratio':>7}")
    for row in rows:
        ratio = row["measured_over_predicted"]
        print(f"{row['dim']:6} {row['measured_bytes'] / 1e6:12.3f} "
              f"{row['predicted_bytes'] / 1e6:13.3f} {ratio if ratio else float('nan'):7.3f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
