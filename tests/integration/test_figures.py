"""`make figures` on fixture runs never collected: collected first, every declared output
drawn (with no kernel warnings), and the summary's numbers checked."""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import matplotlib.image as mpimg
import pytest

from neoxlab.files import REPO_ROOT
from neoxlab.results import figures
from neoxlab.results import tables as collect

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
EXP = "local_compare"


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    """Draw once for the module (kernels are the slow part), as `make figures` does, on run
    dirs never collected: figures collects them first."""
    results = tmp_path_factory.mktemp("fig") / "results"
    shutil.copytree(FIXTURES / "runs" / EXP, results / EXP)
    cmd = [sys.executable, "-m", "neoxlab.results.figures", "--exp", EXP, "--results", str(results)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    print(proc.stdout, proc.stderr)
    return results, proc.returncode, proc.stdout + proc.stderr


def test_uncollected_runs_are_collected_and_drawn_without_kernel_warnings(drawn):
    results, rc, output = drawn
    assert rc == 0, output
    runs = len(list((results / EXP).iterdir()))
    assert f"{EXP}: {runs} run(s), not collected yet: collecting first" in output
    assert (results / "tables" / f"{EXP}.runs.parquet").is_file()
    assert "IPKernelApp" not in output and "without encryption" not in output, output


def test_tables_older_than_a_run_are_collected_again(drawn, tmp_path: Path):
    results = tmp_path / "results"
    shutil.copytree(drawn[0], results)  # keeps the modification times
    assert collect.needs_collecting(EXP, results) is None
    table = results / "tables" / f"{EXP}.runs.parquet"
    later = table.stat().st_mtime + 10
    run = sorted((results / EXP).iterdir())[0]
    os.utime(run / "status.json", (later, later))  # the run went on after collecting
    runs = len(list((results / EXP).iterdir()))
    assert collect.needs_collecting(EXP, results) == (
        f"1 of {runs} run(s) changed since the tables were written")
    table.unlink()
    assert "not collected yet" in collect.needs_collecting(EXP, results)


def test_every_declared_output_is_written(drawn):
    results, rc, _ = drawn
    assert rc == 0
    books = figures.notebooks()
    assert {b.stem for b in books} >= {"throughput", "loss", "comm", "summary_table"}
    for book in (b for b in books if figures.applies_to(b, EXP)):
        outputs = figures.declared_outputs(book, EXP, results)
        assert outputs, f"{book.name} declares no outputs"
        for path in outputs:
            assert path.exists() and path.stat().st_size > 0, path
            if path.suffix == ".png":
                height, width, _ = mpimg.imread(path).shape
                assert width >= 800 and height >= 400, (path, width, height)


def _independent_medians(run_dirs: list[Path]) -> dict[tuple[int, str], dict[str, float]]:
    """Straight from metrics.jsonl and status.json, without neoxlab code."""
    out = {}
    for run_dir in run_dirs:
        if json.loads((run_dir / "status.json").read_text())["state"] != "completed":
            continue
        cfg = json.loads((run_dir / "config.json").read_text())
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        warmup = cfg["train"]["metrics_warmup_steps"]
        steady = [r for r in rows if r["step"] > warmup]
        gpus = cfg["cluster"]["nodes"] * cfg["cluster"]["ranks_per_node"]
        out[(gpus, cfg["compression"]["scheme"])] = {
            "tflops": statistics.median(r["tflops_per_gpu"] for r in steady),
            "samples": statistics.median(r["samples_per_s"] for r in steady),
            "loss": rows[-1]["loss"],
        }
    return out


def test_summary_percentages_equal_independent_ones(drawn):
    results, rc, _ = drawn
    assert rc == 0
    expected = _independent_medians(list((FIXTURES / "runs" / EXP).iterdir()))
    labels = {"Baseline": "none", "Naive ZFP": "naive", "ZHybrid": "zhybrid",
              "MZHybrid": "mzhybrid"}
    text = (results / "tables" / f"{EXP}.summary.md").read_text()
    rows = [line.strip("|").split("|") for line in text.splitlines()
            if re.match(r"\| (Baseline|Naive ZFP|ZHybrid|MZHybrid) \|", line)]
    seen = set()
    for cells in rows:
        name, gpus, _, tflops_gain, _, samples_gain, _, loss_delta = (c.strip() for c in cells)
        key = (int(gpus), labels[name])
        seen.add(key)
        base, mine = expected[(key[0], "none")], expected[key]
        if key[1] == "none":
            assert tflops_gain == samples_gain == loss_delta == "baseline"
            continue
        assert float(tflops_gain) == pytest.approx(
            (mine["tflops"] / base["tflops"] - 1) * 100, abs=0.051)
        assert float(samples_gain) == pytest.approx(
            (mine["samples"] / base["samples"] - 1) * 100, abs=0.051)
        assert float(loss_delta) == pytest.approx(mine["loss"] - base["loss"], abs=0.0006)
    assert seen == set(expected)
    # the runs that did not complete are named with their status, not dropped
    assert "failed after 3 steps" in text and "running after 2 steps" in text
    tex = (results / "tables" / f"{EXP}.summary.tex").read_text()
    assert r"\begin{tabular}" in tex and r"gain (\%)" in tex and "+21.2" in tex


def test_a_failing_notebook_fails_the_command_and_is_named(drawn, tmp_path: Path, capsys):
    results = drawn[0]
    analysis = tmp_path / "analysis"
    analysis.mkdir()
    (analysis / "broken.py").write_text(
        "# %%\nraise RuntimeError('deliberately broken notebook')\n")
    rc = figures.main(["--exp", EXP, "--results", str(results), "--analysis", str(analysis)])
    err = capsys.readouterr().err
    assert rc == 1
    assert "broken.py" in err and "deliberately broken notebook" in err


def test_figures_without_runs_or_tables_says_make_run(tmp_path: Path, capsys):
    assert figures.main(["--exp", EXP, "--results", str(tmp_path)]) == 2
    assert f"run `make run EXP={EXP}` first" in capsys.readouterr().err
    assert figures.main(["--results", str(tmp_path)]) == 2
    assert "run `make run` first" in capsys.readouterr().err


@pytest.mark.timeout(300)
def test_serve_sweep_draws_from_its_tables_only(tmp_path: Path):
    """A serve sweep (tables only, run dir removed after collecting) draws both figures;
    the training notebooks leave it alone."""
    from tests.serve_runs import write_serve_run

    results = tmp_path / "results"
    totals = {gap: {"fused": 1.0, "fused_noreorder": 1.2, "sequential": 4.0 / (i + 1),
                    "static": 1.5} for i, gap in enumerate((20.0, 500.0, 5000.0))}
    run_dir = write_serve_run(results, "flover_sweep", "20261201-100000_sweep", totals)
    assert collect.main(["--exp", "flover_sweep", "--results", str(results)]) == 0
    shutil.rmtree(run_dir)
    assert figures.main(["--exp", "flover_sweep", "--results", str(results)]) == 0
    book = next(b for b in figures.notebooks() if b.stem == "flover_speedup")
    for path in figures.declared_outputs(book, "flover_sweep", results):
        assert path.exists() and path.stat().st_size > 0, path
    drawn = sorted(p.name for p in (results / "figures").iterdir())
    assert drawn == sorted(p.name for p in figures.declared_outputs(book, "flover_sweep",
                                                                      results))
    assert not (results / "tables" / "flover_sweep.summary.md").exists()
