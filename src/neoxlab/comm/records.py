"""Comm accounting out of the ranks: per-rank rows -> comm.jsonl, totals -> summary.json."""

from __future__ import annotations

import json
from pathlib import Path

from neoxlab.comm.accounting import Accountant, totals_by_dim
from neoxlab.config import DIMS
from neoxlab.run import rundir

DIM_ORDER = DIMS


def write_rank_rows(run_dir: Path, rank: int, accountant: Accountant) -> None:
    rundir.write_json(run_dir / "logs" / f"comm.rank{rank}.json", accountant.rows(rank))
    rundir.write_json(run_dir / "logs" / f"comm_groups.rank{rank}.json",
                      accountant.group_rows(rank))
    rundir.write_atomic(run_dir / "logs" / f"timeline.rank{rank}.jsonl",
                        "".join(json.dumps(r) + "\n" for r in accountant.timeline_rows(rank)))


def merge(run_dir: Path, world_size: int) -> dict[str, dict]:
    """Rank 0, after a barrier: one comm.jsonl of all ranks, totals per dimension."""
    rows: list[dict] = []
    for rank in range(world_size):
        path = run_dir / "logs" / f"comm.rank{rank}.json"
        if path.exists():
            rows += json.loads(path.read_text())
    rundir.write_atomic(run_dir / "comm.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    groups: list[dict] = []  # the same bytes by the ranks they went between
    for rank in range(world_size):
        path = run_dir / "logs" / f"comm_groups.rank{rank}.json"
        if path.exists():
            groups += json.loads(path.read_text())
    rundir.write_atomic(run_dir / "comm_groups.jsonl",
                        "".join(json.dumps(r) + "\n" for r in groups))
    totals = totals_by_dim(rows)
    summary_path = run_dir / "summary.json"
    summary = rundir.read_json(summary_path) if summary_path.exists() else {}
    summary["comm"] = totals
    rundir.write_json(summary_path, summary)
    return totals


def format_totals(totals: dict[str, dict]) -> str:
    lines = [f"{'dim':<6}{'calls':>8}{'MB in':>10}{'MB out':>10}{'ratio':>7}"
             f"{'comm s':>9}{'codec s':>9}"]
    for dim in DIM_ORDER:
        t = totals.get(dim)
        if not t:
            continue
        ratio = f"{t['ratio']:.2f}" if t["ratio"] else "-"
        lines.append(
            f"{dim:<6}{t['calls']:>8}{t['bytes_in'] / 1e6:>10.2f}{t['bytes_out'] / 1e6:>10.2f}"
            f"{ratio:>7}{t['comm_s']:>9.2f}{t['compress_s'] + t['decompress_s']:>9.2f}"
            + (f"  {t['library']}" if t.get("library") else "")
        )
    return "\n".join(lines)
