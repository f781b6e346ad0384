"""Bytes per dimension of a real run against what the performance model predicts for it.

`python studies/neox_predict_bytes.py <run_dir> [--json out.json]` reads an uncompressed
run's comm.jsonl (every rank, every call, summed per dimension over the run) and sets it
beside the model's messages for the run's layout (perfmodel.traffic.messages, what
task=predict prices), counted as the comm accounting records a call
(perfmodel.wire_bytes.group_rows: every rank of every group of the dimension, each stage's
calls, per step x steps) and labelled as its classifier labels a call (comm/classify.py: the
cross-entropy statistics and scalars go to `other`). Point-to-point traffic is counted on
both ends, as the accounting records a send and its recv. `--from-data predict_bytes.json`
prints the table of a committed comparison. Built for engine=neox runs
(docs/measurements/2026-12-07-neox-cpu.md); works on builtin runs too.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from neoxlab.comm.classify import Classifier, Grid
from neoxlab.config import Config
from neoxlab.layout import Layout, resolve_layout
from neoxlab.perfmodel import traffic
from neoxlab.perfmodel.wire_bytes import group_rows
from neoxlab.run.rundir import load_config

RECORDED_OP = {"all_gather": "all_gather_into_tensor"}  # the collective GPT-NeoX calls
DIMS = ("dp", "zero", "tp", "pp")


def measured(run_dir: Path) -> dict[str, dict[str, float]]:
    """dim -> op -> bytes accounted (a p2p's send and its recv both)."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for line in (run_dir / "comm.jsonl").read_text().splitlines():
        row = json.loads(line)
        out[row["dim"]][row["op"]] += row["bytes_in"]
    return out


def recorded_dim(classifier: Classifier, msg: traffic.Message, ranks: list[int]) -> str:
    """The dimension the comm patch's classifier gives one call of `msg` in `ranks`."""
    numel = int(msg.nbytes * 8 / msg.float_bits)
    if msg.op == "p2p":
        return classifier.p2p(ranks[0], ranks[1], numel)
    if msg.op == "all_gather":
        numel //= msg.group  # the caller's part
    return classifier.collective(RECORDED_OP.get(msg.op, msg.op), frozenset(ranks), numel)


def predicted_per_step(cfg: Config, layout: Layout) -> dict[str, dict[str, float]]:
    """dim -> op -> bytes the comm accounting of one step should hold, uncompressed."""
    classifier = Classifier(Grid(tp=layout.tp, pp=layout.pp, dp=layout.dp),
                            hidden_size=cfg.model.hidden_size,
                            tokens=layout.micro_batch * cfg.model.seq_length)
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for msg in traffic.messages(cfg, layout):
        for row in group_rows(msg, layout, 1.0, cfg.compression.allreduce):
            dim = recorded_dim(classifier, msg, row["ranks"])
            if row["op"] == "send":  # each end records its half: the send and the recv
                out[dim]["send"] += row["bytes_out"] / 2
                out[dim]["recv"] += row["bytes_out"] / 2
            else:
                out[dim][RECORDED_OP.get(row["op"], row["op"])] += row["bytes_out"]
    return out


def predicted(run_dir: Path, steps: int) -> dict[str, dict[str, float]]:
    cfg = load_config(run_dir)
    per_step = predicted_per_step(cfg, resolve_layout(cfg))
    return {dim: {op: b * steps for op, b in ops.items()} for dim, ops in per_step.items()}


def compare(run_dir: Path) -> list[dict]:
    steps = len((run_dir / "metrics.jsonl").read_text().splitlines())
    real, model = measured(run_dir), predicted(run_dir, steps)
    rows = []
    for dim in (*DIMS, *sorted((set(real) | set(model)) - set(DIMS))):
        real_ops, model_ops = dict(real.get(dim, {})), dict(model.get(dim, {}))
        r, m = sum(real_ops.values()), sum(model_ops.values())
        rows.append({"dim": dim, "measured_bytes": r, "predicted_bytes": m,
                     "measured_over_predicted": r / m if m else None,
                     "measured_by_op": real_ops, "predicted_by_op": model_ops,
                     "steps": steps, "run": run_dir.name})
    return rows


def table(rows: list[dict]) -> str:
    """Dimensions with traffic; the ratio for DP, ZeRO, TP and PP (`other` holds start-up
    broadcasts and collectives over one-rank groups, which the model has no messages for)."""
    lines = [f"{'dim':6} {'measured MB':>12} {'predicted MB':>13} {'ratio':>7}"]
    for row in rows:
        if not row["measured_bytes"] and not row["predicted_bytes"]:
            continue
        ratio = row["measured_over_predicted"]
        shown = f"{ratio:7.3f}" if ratio is not None and row["dim"] in DIMS else f"{'-':>7}"
        lines.append(f"{row['dim']:6} {row['measured_bytes'] / 1e6:12.3f} "
                     f"{row['predicted_bytes'] / 1e6:13.3f} {shown}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, nargs="?")
    parser.add_argument("--json", type=Path, help="write the comparison here")
    parser.add_argument("--from-data", type=Path, help="print a written comparison's table")
    args = parser.parse_args(argv)
    if args.from_data is not None:
        print(table(json.loads(args.from_data.read_text())))
        return 0
    if args.run_dir is None:
        parser.error("give a run dir, or --from-data <predict_bytes.json>")
    rows = compare(args.run_dir.resolve())
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
