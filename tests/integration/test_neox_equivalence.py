"""The builtin engine computes GPT-NeoX's loss: GPT-NeoX's initial weights (its real train.py,
1 CPU rank, fp32, `extra_save_iters: [0]`), converted by the checkout's own HF converter
and loaded by engines/builtin/model/hf_convert.py, on the samples GPT-NeoX drew, give the
builtin engine GPT-NeoX's first-step loss to 1e-4 relative. Any tensor converted or loaded
wrong (or left at the builtin engine's own initialisation) moves the loss far beyond that.
The 100-step curves and the seed band: studies/neox_equivalence.py."""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import REPO_ROOT
from tests.integration.harness import read_metrics

STUDY = REPO_ROOT / "studies" / "neox_equivalence.py"
spec = importlib.util.spec_from_file_location("neox_equivalence", STUDY)
study = importlib.util.module_from_spec(spec)
spec.loader.exec_module(study)

pytestmark = pytest.mark.timeout(600)
SEED = 7


def test_gpt_neox_initial_weights_give_the_builtin_engine_its_first_step_loss(neox_dir,
                                                                           tmp_path):
    run_dir = study.neox_run(1, SEED, [f"cluster.neox_dir={neox_dir}"], tmp_path / "results")
    # the conversion and the samples each read the run in a process of its own: side by side
    # they take one of them's time on CI's 2 cores (each keeps about one core busy)
    with ThreadPoolExecutor(1) as pool:
        converted = pool.submit(study.convert, run_dir, neox_dir, tmp_path / "hf")
        samples = study.neox_samples(run_dir, neox_dir, tmp_path / "samples.pt")
        hf = converted.result()
    _, records = study.builtin_run(tmp_path / "builtin", 1, SEED, [], samples, hf)
    (neox,) = [r["loss"] for r in read_metrics(run_dir)]
    builtin = records[0]["loss"]
    assert abs(builtin - neox) / abs(neox) <= study.REL_TOL, (
        f"first-step loss: GPT-NeoX {neox}, builtin engine from its converted weights {builtin}")
