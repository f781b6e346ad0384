"""The native (C) reference benchmark: builds with the mpich wheel, runs on 2 ranks under
mpiexec, and its output reads back through neoxlab.omb's OSU table parser."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from neoxlab.omb import native
from neoxlab.omb.osu_format import parse_table
from tests.conftest import REPO_ROOT

MPIEXEC = Path(sys.executable).with_name("mpiexec")
SOURCE = REPO_ROOT / "bench" / "native" / "omb_native.c"

pytestmark = [
    pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec at {MPIEXEC}"),
    pytest.mark.skipif(native.c_compiler() is None,
                       reason="no C compiler (cc/gcc/clang) to build bench/native/omb_native.c"),
]


@pytest.fixture(scope="module")
def binary(tmp_path_factory) -> Path:
    return native.build(SOURCE, tmp_path_factory.mktemp("native") / "omb_native")


def run(binary: Path, ranks: int, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(MPIEXEC), "-n", str(ranks), str(binary), *args], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(120)
def test_latency_and_allreduce_tables_parse(binary):
    proc = run(binary, 2, "latency", "-m", "0:8", "-i", "50", "-x", "5", "-f")
    assert proc.returncode == 0, proc.stderr
    assert "# Datatype: MPI_CHAR." in proc.stdout
    rows = parse_table(proc.stdout)
    assert [r["Size"] for r in rows] == [0, 1, 2, 4, 8]
    for r in rows:
        assert r["Iterations"] == 50
        assert 0 < r["Min Latency(us)"] <= r["Avg Latency(us)"] <= r["Max Latency(us)"]

    proc = run(binary, 2, "allreduce", "-m", "1:16", "-i", "20", "-x", "2", "-p", "4",
               "-t", "multiple")
    assert proc.returncode == 0, proc.stderr
    assert "thread level multiple" in proc.stdout  # the level MPI provided, as asked
    rows = parse_table(proc.stdout)
    assert list(rows[0]) == ["Size", "Avg Latency(us)"]
    assert [r["Size"] for r in rows] == [4, 8, 16]  # from one float, as OSU
    assert all(r["Avg Latency(us)"] > 0 for r in rows)
    assert "# Timing: a clock around each call, as OSU 7.4" in proc.stdout
    loop = run(binary, 2, "allreduce", "-m", "4:8", "-i", "20", "-x", "2", "-L")
    assert loop.returncode == 0 and "one clock around all timed calls" in loop.stdout
    values = [ln.split()[1] for ln in proc.stdout.splitlines() if not ln.startswith("#")]
    assert all(len(v.split(".")[1]) == 4 for v in values)  # -p 4 digits


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ranks, args, message", [
    (3, ["latency", "-m", "1:8"], "exactly two ranks"),
    (2, ["allreduce", "-m", "1:2"], "at least one float"),
    (2, ["bcast"], "unknown benchmark"),
    (2, ["latency", "-m", "3:8"], "not a power of two"),
    (2, ["latency", "-t", "many"], "-t takes single"),
])
def test_bad_options_exit_2_once(binary, ranks, args, message):
    proc = run(binary, ranks, *args)
    assert proc.returncode == 2
    assert message in proc.stderr and proc.stderr.count("error:") == 1 and proc.stdout == ""


@pytest.mark.timeout(60)
def test_rebuild_only_when_source_changes(tmp_path):
    src = tmp_path / "omb_native.c"
    src.write_bytes(SOURCE.read_bytes())
    out = native.build(src, tmp_path / "bin" / "omb_native")
    built = out.stat().st_mtime_ns
    native.build(src, out)
    assert out.stat().st_mtime_ns == built  # unchanged source: no rebuild
    os.utime(src, ns=(built + 10**9, built + 10**9))
    native.build(src, out)
    assert out.stat().st_mtime_ns > built


@pytest.mark.timeout(60)
def test_fallback_without_mpicc_builds_a_working_binary(tmp_path, monkeypatch):
    """cc -I/-L against the wheel's headers and library, as when a wheel ships no mpicc."""
    real = native.env_prefix()
    prefix = tmp_path / "env"
    prefix.mkdir()
    for sub in ("include", "lib"):
        (prefix / sub).symlink_to(real / sub)
    monkeypatch.setattr(native, "env_prefix", lambda: prefix)
    assert "mpicc" not in native.compile_command(SOURCE, tmp_path / "x")[0]
    out = native.build(SOURCE, tmp_path / "omb_native")
    proc = run(out, 2, "allreduce", "-m", "4:8", "-i", "5", "-x", "1")
    assert proc.returncode == 0, proc.stderr
    assert [r["Size"] for r in parse_table(proc.stdout)] == [4, 8]
