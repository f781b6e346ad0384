"""task=tune's stage (a) budgets come from the loss-vs-rate map's committed data file
(config/budget_map.py), not from numbers copied into the schema: a changed map changes them."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from neoxlab.config import budget_map
from neoxlab.config.compose import compose_experiment
from tests.conftest import REPO_ROOT

SRC = str(REPO_ROOT / "src")


def rows_of(path):
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def write(path, rows):
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_the_committed_map_gives_the_budgets_its_page_states():
    """2026-12-04-loss-rate-map.md: on each dimension the harmless codec with the largest
    proxy error is ZFP rate 8 (bf16 on TP and ZeRO, fp32 on DP); PP takes TP's."""
    assert budget_map.MAP_FILE.exists()
    got = compose_experiment("tune_local").tune.error_budget
    assert got == {"tp": 0.0203, "dp": 0.0202, "zero": 0.00394, "pp": 0.0203}


def test_a_changed_map_changes_the_budgets_a_tune_composes_with(tmp_path):
    rows = rows_of(budget_map.MAP_FILE)
    for r in rows:  # int4 on TP measured no worse than naive: TP's budget rises to its proxy
        if (r["precision"], r["dim"], r["codec"]) == ("fp32", "tp", "int4"):
            r["deviation"] = "0.0010"
            int4_proxy = float(r["proxy_error"])
    changed = tmp_path / "map.csv"
    write(changed, rows)
    assert budget_map.error_budget(changed)["tp"] == int4_proxy
    # a fresh process whose map is the changed file (the schema's default is read when
    # compose stores the schema, at its import)
    code = ("import json, sys; from pathlib import Path; from neoxlab.config import budget_map; "
            "budget_map.MAP_FILE = Path(sys.argv[1]); "
            "from neoxlab.config.compose import compose_experiment; "
            "print(json.dumps(compose_experiment('tune_local').tune.error_budget))")
    proc = subprocess.run([sys.executable, "-c", code, str(changed)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": SRC})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["tp"] == got["pp"] == int4_proxy
    assert got["dp"] == 0.0202  # the other dimensions as before


def test_an_override_replaces_one_dimensions_budget_only():
    cfg = compose_experiment("tune_local", ["tune.error_budget.dp=1.5"])
    assert cfg.tune.error_budget["dp"] == 1.5 and cfg.tune.error_budget["tp"] == 0.0203


def test_a_map_that_cannot_be_read_names_the_file_and_the_fix(tmp_path):
    with pytest.raises(budget_map.BudgetMapError, match="nowhere.csv.*tune.error_budget"):
        budget_map.error_budget(tmp_path / "nowhere.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("dim,codec\ntp,int8\n")
    with pytest.raises(budget_map.BudgetMapError, match="lacks columns"):
        budget_map.error_budget(bad)
