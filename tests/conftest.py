"""Shared test fixtures: the repo root and a results dir per test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

os.environ.setdefault("DS_ACCELERATOR", "cpu")
# Triton fixes at import whether its jit functions (tl.max too) run in its interpreter, and
# megatron-core imports triton early (through torch._dynamo): on a machine without an NVIDIA
# device the Triton kernel tests need the interpreter chosen before any test module loads.
if not Path("/dev/nvidiactl").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    path = tmp_path / "results"
    path.mkdir()
    return path


@pytest.fixture(scope="module")
def one_torch_thread():
    """Codec tests on small tensors: a second intra-op thread only adds waiting on a busy
    machine. Modules opt in with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
