"""Fixtures for integration tests: `requires_slurm` skips (or, in CI, fails) without Slurm."""

from __future__ import annotations

import os

import pytest

from tests.integration.slurm import slurm_ready_cached


@pytest.fixture
def requires_slurm() -> None:
    """Skip with the reason when no Slurm controller/node answers; fail when CI requires it."""
    reason = slurm_ready_cached()
    if reason is None:
        return
    if os.environ.get("NEOXLAB_REQUIRE_SLURM") == "1":
        pytest.fail(f"NEOXLAB_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)
