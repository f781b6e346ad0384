"""The layout's memory estimate counts what compressed collectives hold: the largest scratch of
any compressed op of the run (every op in segments) and the error-feedback residuals (one
per DP bucket: the gradients); each op's measured peak stays within its bound."""

from __future__ import annotations

import subprocess
import sys

import pytest

from neoxlab.config.compose import compose_experiment
from neoxlab.layout import estimate_memory, layout_of
from tests.conftest import REPO_ROOT

GIB = 1 << 30


def test_error_feedback_residuals_are_a_copy_of_the_gradients():
    cfg = compose_experiment("hybrid_192gpu", ["launch.submit=false"])
    layout = layout_of(cfg)
    plain = estimate_memory(cfg, layout)
    cfg.compression.dims["dp"].error_feedback = True
    ef = estimate_memory(cfg, layout)
    grad_bytes = plain.params_per_device * 2  # fp16 gradients, not sharded by ZeRO-1
    assert ef.total - plain.total == pytest.approx(grad_bytes)


@pytest.mark.parametrize("dim", ["zero", "tp", "pp"])
def test_compressing_any_dimension_counts_its_scratch(dim):
    """Only `dim` compressed (zfp rate 8): ZeRO all-gathers, TP all-reduces and PP sends
    hold payloads too, not only DP gradient buckets."""
    cfg = compose_experiment("hybrid_192gpu", ["launch.submit=false"])
    for name, d in cfg.compression.dims.items():
        d.compressor = "zfp" if name == dim else "none"
        d.params = {"rate": 8} if name == dim else {}
    est = estimate_memory(cfg, layout_of(cfg))
    assert est.communication > 0
    m, layout = cfg.model, layout_of(cfg)
    activation = m.seq_length * layout.micro_batch * m.hidden_size * 2
    assert est.communication >= min(activation, 64 << 20) / 4  # at least one payload


def test_every_compressed_op_peaks_within_its_bound():
    """bench/device/op_memory.py on CPU: each op, error feedback on, raw (passthrough) and
    fp16 payloads; the resident-set high-water mark of the call against op_scratch_bytes."""
    out = subprocess.run(
        [sys.executable, "bench/device/op_memory.py", "--mib", "8", "--ranks", "4",
         "--collective-only"],
        capture_output=True, text=True, timeout=600, cwd=REPO_ROOT, check=False,
        env={"PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1",
             "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines()[1:] if line.strip()]
    assert len(rows) == 18  # 9 calls x 2 codecs, each measured


def test_codec_temporaries_on_the_torch_path_stay_within_the_estimate():
    """Lassen's path (NEOXLAB_CODEC_KERNELS=torch, the codecs' device paths run on CPU):
    ZFP, mpc and topk on bf16 input hold their own temporaries beside the collective's
    buffers; ZFP works in chunks of a bounded size and upcasts a chunk at a time, and the
    estimate counts the codecs' budget (comm_scratch.codec_scratch_bytes)."""
    out = subprocess.run(
        [sys.executable, "bench/device/op_memory.py", "--mib", "4", "--ranks", "4",
         "--dtype", "bfloat16", "--device-paths", "--ops", "all_reduce", "broadcast",
         "--specs", "zfp:rate=8,impl=torch", "mpc", "topk"],
        capture_output=True, text=True, timeout=900, cwd=REPO_ROOT, check=False,
        env={"PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1",
             "PATH": "/usr/bin:/bin", "NEOXLAB_CODEC_KERNELS": "torch"})
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines()[1:] if line.strip()]
    assert len(rows) == 9  # (2 all-reduces + broadcast) x 3 codecs, each measured
