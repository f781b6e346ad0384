"""results/manifests/<experiment>.jsonl: every run of an experiment and the jobs behind it.

One JSON line per submission (appended, never rewritten), so a requeued run adds lines
with the same run id and a new job id; `make status` reads it back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from neoxlab.files import now

DIR = "manifests"


def path_of(results: Path, experiment: str) -> Path:
    """Beside the run dirs, not among them: results/<exp>/ holds run dirs only."""
    return results / DIR / f"{experiment}.jsonl"


def record(results: Path, experiment: str, **entry: Any) -> dict[str, Any]:
    """Append one entry; O_APPEND keeps concurrent writers' lines whole."""
    entry = {"submitted_at": now(), **entry}
    line = (json.dumps(entry, sort_keys=True) + "\n").encode()
    path = path_of(results, experiment)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return entry


def record_job(run_dir: Path, cfg, job_id: str | None, **extra: Any) -> dict[str, Any]:
    """One submission of a run (results/<exp>/<run_id>): who, where, which job."""
    return record(run_dir.parent.parent, cfg.experiment, run_id=run_dir.name,
                  run_dir=str(run_dir), job_id=job_id, scheduler=cfg.cluster.scheduler,
                  cluster=cfg.cluster.name, **extra)


def read(results: Path, experiment: str) -> list[dict[str, Any]]:
    path = path_of(results, experiment)
    if not path.exists():
        return []
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            print(f"[neoxlab] warning: {path}:{number} is not JSON; skipped")
    return entries
