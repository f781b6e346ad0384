"""studies/neox_equivalence.py's table: first-step difference, deviation against the
builtin engine's seed band, and the learning rates compared at the step that applies them."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from tests.conftest import REPO_ROOT

STUDY = REPO_ROOT / "studies" / "neox_equivalence.py"
spec = importlib.util.spec_from_file_location("neox_equivalence", STUDY)
study = importlib.util.module_from_spec(spec)
spec.loader.exec_module(study)

STEPS = 10
SPREAD = {1: 0.0, 2: 0.2, 3: 0.4}  # builtin seed s lies SPREAD[s] above a common curve


def rows(neox_offset: float) -> list[dict]:
    curve = np.linspace(6.0, 3.0, STEPS)
    applied = list(np.linspace(6e-4, 1e-4, STEPS))  # the rate each step applies
    logged = applied[1:] + [6e-5]  # GPT-NeoX logs the rate after its scheduler stepped
    out = []
    for seed, up in SPREAD.items():
        builtin = curve + up
        out.append({"role": "builtin", "seed": seed, "loss": list(builtin), "lr": applied})
        out.append({"role": "neox", "seed": seed, "loss": list(builtin + neox_offset),
                    "lr": logged})
    return out


def test_a_curve_closer_than_the_seed_spread_is_inside_and_a_farther_one_is_not():
    band = max(SPREAD.values()) - min(SPREAD.values())
    inside = study.table(rows(band / 2))
    assert inside["band"] == pytest.approx(band)
    assert all(r["inside"] for r in inside["rows"])
    assert all(r["mean_dev_late"] == pytest.approx(band / 2) for r in inside["rows"])
    outside = study.table(rows(band * 1.5))
    assert not any(r["inside"] for r in outside["rows"])


def test_first_step_difference_is_relative_to_gpt_neox_and_rates_line_up_by_step():
    t = study.table(rows(0.01))
    for r in t["rows"]:
        assert r["first_rel"] == pytest.approx(0.01 / r["first_neox"])
        assert r["lr_max_rel"] == pytest.approx(0.0, abs=1e-12)  # shifted by one step: equal


def test_one_seed_has_no_band_and_no_verdict():
    t = study.table([r for r in rows(0.0) if r["seed"] == 1])
    assert t["band"] is None and not t["rows"][0]["inside"]
