"""The launcher's last act before its final status: every rank process gone."""

from __future__ import annotations

import signal
import subprocess
import sys

from neoxlab.launch.failure import RankWatch


def _rank(run_dir, rank: int, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
    (run_dir / "logs" / f"rank{rank}.pid").write_text(str(proc.pid))
    return proc


def test_reap_waits_for_exiting_ranks_and_kills_stragglers(tmp_path):
    (tmp_path / "logs").mkdir()
    exiting, stuck = _rank(tmp_path, 0, 0.5), _rank(tmp_path, 1, 120)
    try:
        RankWatch(tmp_path, world_size=2).reap(timeout=3)
        assert exiting.poll() == 0  # reap returned after it ended on its own, not killed
        assert stuck.wait(timeout=5) == -signal.SIGKILL
    finally:
        stuck.kill()
