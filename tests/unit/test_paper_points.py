"""The paper figure's published gains sit only beside a grid they can be compared with."""

from __future__ import annotations

import pandas as pd

from neoxlab.results import paper


def _points(model: str, device: str) -> pd.DataFrame:
    return pd.DataFrame([{"scheme": s, "gpus": 8, "model": model, "device": device}
                         for s in ("none", "naive")])


def test_published_gains_belong_beside_the_papers_model_on_gpus():
    assert paper.published_note(_points("neox_20b", "v100")) is None
    assert paper.published_note(_points("None", "")) is None  # a log given alone: unknown


def test_a_cpu_grid_says_why_the_published_gains_are_left_out():
    note = paper.published_note(_points("neox_tiny", "cpu"))
    assert note is not None and "not drawn" in note
    assert "neox_tiny on CPU ranks" in note and "V100" in note
    assert paper.published_note(_points("neox_20b", "cpu")) is not None
    assert paper.published_note(_points("neox_tiny", "v100")) is not None
