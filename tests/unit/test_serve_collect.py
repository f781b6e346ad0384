"""Serve runs in the tables: one row per policy and gap with fused's advantage, one per
request; training experiments get no serve tables; notebooks pick their experiments; a
`run:` weights source that cannot be served is refused before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from neoxlab.config import ConfigError, to_dict
from neoxlab.config.compose import compose_experiment
from neoxlab.results import figures
from neoxlab.results import tables as collect
from neoxlab.serve.rules import check_serve
from neoxlab.tasks import TASKS
from tests.serve_runs import write_serve_run

TOTALS = {20.0: {"fused": 0.5, "fused_noreorder": 0.6, "sequential": 2.0},
          1000.0: {"fused": 3.0, "fused_noreorder": 3.0, "sequential": 3.3}}


@pytest.mark.parametrize("old_names", [False, True])
def test_serve_run_becomes_policy_and_request_tables(results_dir: Path, old_names: bool):
    """old_names: a run dir written before the policy names (`engines`, `engine`) gives the
    same tables."""
    write_serve_run(results_dir, "flover_sweep", "20261201-100000_a", TOTALS,
                    old_names=old_names)
    write_serve_run(results_dir, "flover_sweep", "20261201-100001_b", TOTALS, state="failed",
                    old_names=old_names)
    tables = collect.collect("flover_sweep", results_dir)

    runs = tables["runs"].set_index("run_id")
    assert list(runs["task"]) == ["serve", "serve"]
    assert list(runs["status"]) == ["completed", "failed"]
    serve = tables["serve"]
    assert len(serve) == 6  # the failed run wrote no summary: no rows, but its run row stays
    assert "engine" not in serve.columns
    by = serve.set_index(["gap_ms", "policy"])
    assert by.loc[(20.0, "sequential"), "fused_speedup"] == pytest.approx(2.0 / 0.5)
    assert by.loc[(20.0, "fused_noreorder"), "fused_speedup"] == pytest.approx(0.6 / 0.5)
    assert by.loc[(1000.0, "sequential"), "fused_speedup"] == pytest.approx(3.3 / 3.0)
    assert by.loc[(20.0, "fused"), "fused_speedup"] == pytest.approx(1.0)
    assert by.loc[(20.0, "fused"), "speedup"] == pytest.approx(4.0)
    assert set(serve["weights_source"]) == {"random (seed 1234)"}
    assert set(serve["status"]) == {"completed"} and set(serve["gap_scale"]) == {0.1}

    requests = tables["serve_requests"]
    assert len(requests) == 6 * 3
    assert "tokens" not in requests.columns and set(requests["output_tokens"]) == {4}
    last = requests[(requests["policy"] == "sequential") & (requests["gap_ms"] == 20.0)
                    & (requests["rid"] == 2)].iloc[0]
    assert last["latency_s"] == pytest.approx(2.0 - 0.04)
    out = results_dir / "tables"
    for name in ("serve.parquet", "serve.csv", "serve_requests.parquet", "runs.parquet"):
        assert (out / f"flover_sweep.{name}").exists(), name


def test_a_cut_off_request_line_is_counted_not_fatal(results_dir: Path):
    run_dir = write_serve_run(results_dir, "flover_sweep", "20261201-100000_a", TOTALS)
    with (run_dir / "serve_results.jsonl").open("a") as f:
        f.write('{"gap_ms": 20.0, "policy": "fu')  # a crash mid-line
    tables = collect.collect("flover_sweep", results_dir)
    assert len(tables["serve_requests"]) == 6 * 3
    assert tables["runs"]["malformed_lines"].tolist() == [1]


def test_training_experiments_get_no_serve_tables(results_dir: Path):
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "local_compare"
    import shutil

    shutil.copytree(fixture, results_dir / "local_compare")
    tables = collect.collect("local_compare", results_dir)
    assert "serve" not in tables and "serve_requests" not in tables
    assert not (results_dir / "tables" / "local_compare.serve.parquet").exists()


def test_notebooks_pick_their_experiments():
    books = {b.stem: b for b in figures.notebooks()}
    training = ("throughput", "loss", "comm", "summary_table")
    for exp in ("flover_sweep", "flover_poisson", "flover_tp2"):
        assert figures.applies_to(books["flover_speedup"], exp)
        assert not any(figures.applies_to(books[n], exp) for n in training), exp
    for exp in ("local_compare", "hybrid_192gpu"):
        assert not figures.applies_to(books["flover_speedup"], exp)
        assert all(figures.applies_to(books[n], exp) for n in training), exp
    outputs = figures.declared_outputs(books["flover_speedup"], "flover_sweep", Path("r"))
    assert [p.name for p in outputs] == [
        "flover_sweep.speedup.png", "flover_sweep.speedup.pdf",
        "flover_sweep.latency.png", "flover_sweep.latency.pdf"]


def _fake_training_run(path: Path, **model) -> Path:
    cfg = to_dict(compose_experiment("local_3d", [f"model.{k}={v}" for k, v in model.items()]))
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def _serve_cfg(weights: str, *more: str):
    return compose_experiment("flover_poisson", ["model=neox_tiny", "serve.max_seq_len=64",
                                                 "serve.output_len_max=40",
                                                 f"serve.weights={weights}", *more])


def test_run_weights_are_checked_before_anything_starts(tmp_path: Path):
    with pytest.raises(ConfigError, match="not a run dir"):
        check_serve(_serve_cfg(f"run:{tmp_path}"))

    run = _fake_training_run(tmp_path / "run")
    with pytest.raises(ConfigError, match=r"no usable checkpoint.*none written"):
        check_serve(_serve_cfg(f"run:{run}"))
    step = run / "checkpoints" / "step3"
    step.mkdir(parents=True)
    (step / "layer_00-model_00-model_states.pt").write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"step 3: no completion marker"):
        check_serve(_serve_cfg(f"run:{run}"))

    with pytest.raises(ConfigError, match=r"hidden_size: run 64, serve 256.*model=neox_tiny"):
        check_serve(compose_experiment("flover_poisson", [f"serve.weights=run:{run}"]))

    serve_run = tmp_path / "served"
    serve_run.mkdir()
    (serve_run / "config.json").write_text(json.dumps(to_dict(_serve_cfg("random"))))
    with pytest.raises(ConfigError, match="a task=serve run.*builtin training runs"):
        check_serve(_serve_cfg(f"run:{serve_run}"), trains=lambda name: TASKS[name].trains)
    with pytest.raises(ConfigError, match=r"'ckpt:x' is not 'random', 'hf:.*'run:"):
        check_serve(_serve_cfg("ckpt:x"))
