"""neoxlab.omb under real mpiexec launches: results are validated on every rank.

Sizes and iteration counts are tiny: these tests check correctness, not speed (that is what
the benchmark itself is for). Every launch has a timeout so a hang fails instead of blocking.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

MPIEXEC = Path(sys.executable).with_name("mpiexec")
TIMEOUT = 120

pytestmark = pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec at {MPIEXEC}")


def launch(ranks: int, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(MPIEXEC), "-n", str(ranks), sys.executable, *argv]
    return subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT)


def omb(ranks: int, *args: str) -> subprocess.CompletedProcess:
    return launch(ranks, "-m", "neoxlab.omb", *args)


def omb_json(ranks: int, *args: str) -> dict:
    proc = omb(ranks, *args, "--format", "json")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return json.loads(proc.stdout)


def assert_all_pass(doc: dict, sizes: list[int]) -> None:
    assert [r["size"] for r in doc["rows"]] == sizes
    for row in doc["rows"]:
        assert row["validation"] == "Pass", row
        assert row["avg_us"] > 0 and row["min_us"] <= row["avg_us"] <= row["max_us"], row


def powers(lo: int, hi: int) -> list[int]:
    return [1 << k for k in range(lo.bit_length() - 1, hi.bit_length())]


@pytest.mark.parametrize("buffer", ["numpy", "torch"])
def test_latency_validated_json(buffer):
    doc = omb_json(2, "latency", "--buffer", buffer, "-m", "0:4096", "-i", "20", "-x", "2",
                   "--validate", "--full")
    assert (doc["benchmark"], doc["buffer"], doc["world_size"]) == ("latency", buffer, 2)
    assert (doc["thread_level"], doc["timing"]) == ("single", "osu")  # OSU's, by default
    assert_all_pass(doc, [0] + powers(1, 4096))
    assert all(r["iterations"] == 20 for r in doc["rows"])


def test_bandwidth_table_is_osu_shaped():
    proc = omb(2, "bibw", "-m", "1:1024", "-i", "3", "-x", "1", "-W", "8", "--validate")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "# OSU MPI Bi-Directional Bandwidth Test v7.4"
    rows = [ln.split() for ln in lines if not ln.startswith("#")]
    assert [int(r[0]) for r in rows] == powers(1, 1024)
    # two decimals of MB/s: a 1 B message on a loaded machine can round to 0.00
    assert all(float(r[1]) >= 0 and r[2] == "Pass" for r in rows)
    assert float(rows[-1][1]) > 0


# every collective, validated, then with one corrupted element, in one 4-rank launch
COLLECTIVES_SCRIPT = """
import json, sys
from mpi4py import MPI
from neoxlab.omb import OmbOptions, run_benchmark
out = {}
for name in sys.argv[1:]:
    for inject in (False, True):
        opts = OmbOptions(benchmark=name, buffer="numpy", dtype="float", min_size=4,
                          max_size=256, iterations=3, warmup=1, validate=True,
                          inject_error=inject)
        rows = run_benchmark(opts)
        out[f"{name}:{inject}"] = [(r.size, r.validation, r.avg_us) for r in rows]
if MPI.COMM_WORLD.rank == 0:
    print(json.dumps(out))
"""

COLLECTIVES = ["allreduce", "allgather", "alltoall", "bcast", "reduce", "reduce_scatter",
               "gather", "scatter", "barrier"]


def test_every_collective_validates_and_catches_a_corrupted_element():
    proc = launch(4, "-c", COLLECTIVES_SCRIPT, *COLLECTIVES)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for name in COLLECTIVES:
        good, bad = out[f"{name}:False"], out[f"{name}:True"]
        sizes = [0] if name == "barrier" else powers(4, 256)
        assert [s for s, _, _ in good] == sizes, name
        assert all(v == "Pass" and t > 0 for _, v, t in good), (name, good)
        assert all(v == "Fail" for _, v, _ in bad), (name, bad)


def test_collective_cli_with_bytearray_and_char():
    doc = omb_json(4, "alltoall", "--buffer", "bytearray", "-m", "1:64", "-i", "3", "-x", "1",
                   "--validate", "--thread-level", "multiple")
    assert doc["world_size"] == 4 and doc["thread_level"] == "multiple"
    assert_all_pass(doc, powers(1, 64))
    assert all(r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 3 / 4) for r in doc["rows"])


def test_allreduce_from_1_byte_starts_at_one_float_and_says_so():
    """OSU's habit: -m 1:4096 runs, from the datatype's size; the header tells how it timed."""
    proc = omb(2, "allreduce", "-m", "1:4096", "-i", "5", "-x", "1")
    assert proc.returncode == 0, proc.stderr
    head = [ln for ln in proc.stdout.splitlines() if ln.startswith("#")]
    assert "# Sizes start at 4 B, one float element: smaller ones are skipped, as OSU does." \
        in head
    assert "# MPI thread level: single (as OSU's MPI_Init)." in head
    assert any(ln.startswith("# Timing: as OSU 7.4, a clock around each call") for ln in head)
    rows = [ln.split() for ln in proc.stdout.splitlines() if not ln.startswith("#")]
    assert [int(r[0]) for r in rows] == powers(4, 4096)
    assert all(float(r[1]) > 0 for r in rows)


def test_torch_backend_allreduce_over_gloo():
    doc = omb_json(4, "allreduce", "--backend", "torch", "--buffer", "torch", "-m", "4:64",
                   "-i", "3", "-x", "1", "--validate", "--barrier")
    assert doc["backend"] == "torch"
    assert_all_pass(doc, powers(4, 64))


@pytest.mark.parametrize("spec, lossless", [("zfp:rate=16", False), ("mpc", True)])
def test_compressed_allreduce(spec, lossless):
    compress = pytest.importorskip("neoxlab.compress")
    assert compress.make_compressor(spec).lossless is lossless
    doc = omb_json(2, "allreduce", "--buffer", "torch", "--compress", spec, "-m", "4:16384",
                   "-i", "2", "-x", "1", "--validate")
    assert doc["compress"] == spec
    assert_all_pass(doc, powers(4, 16384))
    big = doc["rows"][-1]
    assert big["compression_ratio"] > 1.1  # smooth data does compress
    assert big["effective_busbw_GBps"] == pytest.approx(big["busbw_GBps"]
                                                        * big["compression_ratio"])


def test_injected_error_fails_validation_with_nonzero_exit():
    proc = omb(2, "latency", "-m", "1:64", "-i", "3", "-x", "0", "--validate", "--inject-error")
    assert proc.returncode == 1
    rows = [ln.split() for ln in proc.stdout.splitlines() if not ln.startswith("#")]
    assert rows and all(r[-1] == "Fail" for r in rows)
    assert "validation failed" in proc.stderr


def test_injected_error_in_compressed_run_fails():
    pytest.importorskip("neoxlab.compress")
    proc = omb(2, "allreduce", "--buffer", "torch", "--compress", "zfp:rate=8", "-m", "64:256",
               "-i", "2", "-x", "0", "--validate", "--inject-error")
    assert proc.returncode == 1, proc.stderr


@pytest.mark.parametrize("ranks, args, message", [
    (2, ["allreducex"], "unknown benchmark"),
    (4, ["latency"], "exactly two ranks"),
    (2, ["bcast", "-m", "3:64"], "powers of two"),
    (2, ["allgather", "-m", "64:8"], "larger than the maximum"),
])
def test_bad_options_exit_2_with_a_message(ranks, args, message):
    proc = omb(ranks, *args)
    assert proc.returncode == 2
    assert message in proc.stderr and proc.stdout == ""
    assert proc.stderr.count("error:") == 1  # printed once, by rank 0


def test_unavailable_buffer_is_named_and_skippable():
    try:
        import cupy  # noqa: F401

        pytest.skip("cupy is installed here, so cupy buffers may be available")
    except ImportError:
        pass
    proc = omb(2, "latency", "--buffer", "cupy", "-m", "1:8")
    assert proc.returncode == 2
    assert "--buffer cupy is not available here: cupy is not installed" in proc.stderr
    proc = omb(2, "latency", "--buffer", "cupy", "-m", "1:8", "--skip-unavailable")
    assert proc.returncode == 0 and "skipped" in proc.stderr and proc.stdout == ""
