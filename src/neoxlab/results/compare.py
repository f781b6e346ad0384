"""Run several experiments one after another and print one comparison table.

Each member is an ordinary run (own run dir, own status); a failed member is reported in the
table and does not stop the others.
"""

from __future__ import annotations

from pathlib import Path

from neoxlab.config import COMPRESSIBLE_DIMS
from neoxlab.run import rundir


def member_row(name: str, run_dir: Path | None) -> dict:
    row: dict = {"experiment": name, "run_dir": str(run_dir) if run_dir else None}
    if run_dir is None:
        return {**row, "state": "not started"}
    row["state"] = rundir.read_json(run_dir / "status.json")["state"]
    summary_path = run_dir / "summary.json"
    if summary_path.exists():
        s = rundir.read_json(summary_path)
        row.update(final_loss=s.get("final_loss"), samples_per_s=s.get("median_samples_per_s"))
        for dim, t in s.get("comm", {}).items():
            row[f"{dim}_mb_in"] = t["bytes_in"] / 1e6
            row[f"{dim}_mb_out"] = t["bytes_out"] / 1e6
    return row


def format_table(rows: list[dict]) -> str:
    dims = COMPRESSIBLE_DIMS
    head = f"{'experiment':<18}{'state':<11}{'final loss':>11}{'samples/s':>10}"
    head += "".join(f"{d + ' MB in->out':>20}" for d in dims)
    lines = [head]
    for r in rows:
        loss = f"{r['final_loss']:.4f}" if r.get("final_loss") is not None else "-"
        sps = f"{r['samples_per_s']:.2f}" if r.get("samples_per_s") is not None else "-"
        line = f"{r['experiment']:<18}{r['state']:<11}{loss:>11}{sps:>10}"
        for d in dims:
            cell = (f"{r[f'{d}_mb_in']:.1f}->{r[f'{d}_mb_out']:.1f}"
                    if f"{d}_mb_in" in r else "-")
            line += f"{cell:>20}"
        lines.append(line)
    return "\n".join(lines)
