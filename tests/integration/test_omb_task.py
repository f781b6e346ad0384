"""The micro-benchmarks as a harness task: run dir, status, every benchmark's rows."""

from __future__ import annotations

import json

from tests.integration.harness import read_status, run_experiment


def test_omb_collectives_experiment_writes_validated_rows(results_dir):
    proc, run_dir = run_experiment(
        # 4 busy-polling MPI ranks on 2 cores: each iteration costs scheduler time slices,
        # and what is checked (validated rows of every collective) needs only a few
        "omb_collectives", results_dir, "omb.max_size=64", "omb.iterations=3",
        "omb.warmup=1", timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert read_status(run_dir)["state"] == "completed"
    rows = [json.loads(line) for line in (run_dir / "omb.jsonl").read_text().splitlines()]
    expected = {"allreduce", "allgather", "alltoall", "bcast", "barrier", "gather", "reduce",
                "reduce_scatter", "scatter"}
    assert {r["benchmark"] for r in rows} == expected
    assert all(r["validation"] in ("Pass", None, "") for r in rows), rows
    assert all(r["avg_us"] > 0 for r in rows)
    assert "# OSU MPI" in proc.stderr + proc.stdout


def test_bad_omb_option_is_refused_before_anything_starts(results_dir):
    from neoxlab.commands.cli import main

    code = main(["experiment=omb_latency", "omb.max_size=1000",
                 f"launch.results_dir={results_dir}"])
    assert code == 2
    assert not any(results_dir.rglob("*"))


def test_concurrent_groups_that_do_not_divide_the_ranks_are_refused(results_dir, capsys):
    from neoxlab.commands.cli import main

    code = main(["experiment=omb_collectives", "omb.groups=3",
                 f"launch.results_dir={results_dir}"])
    assert code == 2
    assert "omb.groups=3 with 4 ranks" in capsys.readouterr().err
    assert not any(results_dir.rglob("*"))
