"""The MPI process group on a GPU rank, on CPU: whether the library mpi4py loaded takes device
pointers (asked of that library, which mpi4py loads privately), the start-up line when it
does not, what MPI is handed for a CUDA tensor (detached, converted and made contiguous
before the stream is synchronized), and the library's CUDA switches in the job.

A stand-in libmpi (a few lines of C, built here) answers MPIX_Query_cuda_support and is
loaded with RTLD_LOCAL as mpi4py loads the real one; CUDA tensors are duck-typed stand-ins
that log what is done to them."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import types

import pytest
import torch

from neoxlab.comm import mpi_group
from neoxlab.commands.check import check
from neoxlab.commands.plan import plan_run
from neoxlab.config.compose import compose_experiment
from neoxlab.launch import lsf
from neoxlab.launch.ranks import rank_env
from neoxlab.tasks import TASKS
from tests.conftest import REPO_ROOT


@pytest.fixture
def fake_mpi(tmp_path, monkeypatch):
    """Install a stand-in mpi4py.MPI whose library answers MPIX_Query_cuda_support with
    `answer`, loaded privately (RTLD_LOCAL), as mpi4py does."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build the stand-in MPI library")
    import mpi4py

    def install(answer: int) -> str:
        src = tmp_path / f"fake{answer}.c"
        lib = tmp_path / f"libmpi_fake{answer}.so"
        src.write_text(f"int MPIX_Query_cuda_support(void) {{ return {answer}; }}\n")
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
        ctypes.CDLL(str(lib), mode=os.RTLD_LOCAL)  # loaded, but not into the global scope
        fake = types.ModuleType("mpi4py.MPI")
        fake.__file__ = str(lib)
        fake.Get_library_version = lambda: f"Stand-in MPI {answer}\nsecond line"
        monkeypatch.setitem(sys.modules, "mpi4py.MPI", fake)
        monkeypatch.setattr(mpi4py, "MPI", fake, raising=False)
        return str(lib)

    monkeypatch.setattr(mpi_group, "_ANNOUNCED", [], raising=False)  # a fresh process
    return install


def test_cuda_support_is_asked_of_the_library_mpi4py_loaded(fake_mpi):
    lib = fake_mpi(1)
    with pytest.raises(AttributeError):
        ctypes.CDLL(None).MPIX_Query_cuda_support  # noqa: B018  (not in the global scope)
    assert mpi_group.cuda_aware() is True
    support = mpi_group.cuda_support()
    assert support.source == lib and support.library == "Stand-in MPI 1"


def test_a_library_that_says_no_is_host_only(fake_mpi):
    fake_mpi(0)
    support = mpi_group.cuda_support()
    assert support.aware is False and support.source is not None


def test_the_real_mpich_answers_from_where_mpi4py_loaded_it():
    """The venv's MPICH exports MPIX_Query_cuda_support (built without CUDA: it says no);
    the global namespace does not have it."""
    code = ("import ctypes; from neoxlab.comm import mpi_group as m; s = m.cuda_support()\n"
            "print('SOURCE', s.source); print('AWARE', s.aware)\n"
            "print('GLOBAL', hasattr(ctypes.CDLL(None), 'MPIX_Query_cuda_support'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=REPO_ROOT, check=False,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")})
    assert out.returncode == 0, out.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert lines["GLOBAL"] == "False"
    assert lines["SOURCE"] not in ("None", "the global namespace")
    assert lines["AWARE"] == "False"


class FakeComm:
    def Get_rank(self):  # noqa: N802 (MPI's name)
        return 0

    def Get_size(self):  # noqa: N802
        return 2


def test_a_gpu_rank_says_once_that_mpi_is_not_cuda_aware(fake_mpi, monkeypatch, capsys):
    fake_mpi(0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    groups = [mpi_group.MpiProcessGroup(FakeComm()) for _ in range(3)]
    assert not any(g.device_pointers for g in groups)
    lines = [x for x in capsys.readouterr().out.splitlines() if "CUDA-aware" in x]
    assert len(lines) == 1 and "Stand-in MPI 0 is not CUDA-aware" in lines[0]
    assert "staged through host memory" in lines[0]


class FakeCudaTensor:
    """What _buffer does to a CUDA tensor, logged (on CPU, without a GPU)."""

    def __init__(self, log: list, dtype=torch.float16, contiguous=True, requires_grad=True):
        self.log, self.dtype = log, dtype
        self.contiguous_, self.requires_grad = contiguous, requires_grad
        self.device = torch.device("cuda", 0)

    def _new(self, op, **kw):
        self.log.append(op)
        args = {"dtype": self.dtype, "contiguous": self.contiguous_, "requires_grad": False}
        return FakeCudaTensor(self.log, **{**args, **kw})

    def detach(self):
        return self._new("detach")

    def is_contiguous(self):
        return self.contiguous_

    def contiguous(self):
        return self._new("contiguous", contiguous=True)

    def float(self):
        return self._new("float", dtype=torch.float32, contiguous=True)

    def cpu(self):
        self.log.append("cpu")
        return torch.zeros(4, dtype=self.dtype)

    def view(self, dtype):
        return self._new("view", dtype=dtype)

    def copy_(self, other):
        self.log.append("copy_back")
        return self


@pytest.fixture
def device_group(monkeypatch):
    log: list = []

    class Stream:
        def synchronize(self):
            log.append("sync")

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    return mpi_group.MpiProcessGroup(FakeComm(), device_pointers=True), log


def test_a_half_reduction_stays_on_the_device_and_is_ready_before_mpi_reads(device_group):
    group, log = device_group
    x = FakeCudaTensor(log, dtype=torch.float16, requires_grad=True)
    with group._buffer(x, reduce=True) as buf:
        log.append("mpi")
    assert "cpu" not in log and group.staged == 0
    assert log.index("float") < log.index("sync") < log.index("mpi") < log.index("copy_back")
    assert buf.requires_grad is False and buf.dtype == torch.float32


def test_a_strided_tensor_is_made_contiguous_before_the_sync(device_group):
    group, log = device_group
    x = FakeCudaTensor(log, dtype=torch.float32, contiguous=False)
    with group._buffer(x, write=False) as buf:
        log.append("mpi")
    assert log.index("contiguous") < log.index("sync") < log.index("mpi")
    assert buf.is_contiguous() and not buf.requires_grad


def test_mpi_sees_a_detached_view_of_a_tensor_that_requires_grad():
    """megatron's TP all-reduce runs inside an autograd Function on a tensor that requires
    grad; the CUDA array interface refuses such a tensor, so MPI must get it detached."""
    x = FakeCudaTensor([], dtype=torch.float32, requires_grad=True)
    assert mpi_group._mpi_view(x).requires_grad is False
    y = torch.ones(3, requires_grad=True)
    assert mpi_group._mpi_view(y).tolist() == [1.0, 1.0, 1.0]


# ---- the library's CUDA switches in the job --------------------------------------------
DP_ON_MPI = "+engine.group_backends.dp=mpi"


def _lsf_script(tmp_path, overrides):
    cfg = compose_experiment("hybrid_192gpu", [*overrides, "launch.submit=false"])
    return cfg, lsf.render(cfg, plan_run(cfg, check(cfg), root=tmp_path),
                           TASKS[cfg.task.name].program)


def test_spectrum_gets_jsrun_gpu_args_when_mpi_groups_carry_cuda_tensors(tmp_path):
    _, text = _lsf_script(tmp_path, [DP_ON_MPI])
    assert "-d packed --smpiargs=-gpu \\" in text
    _, plain = _lsf_script(tmp_path / "b", [])
    assert "--smpiargs" not in plain  # nothing on MPI groups: the job starts as before


def test_mvapich2_gdr_gets_mv2_use_cuda(tmp_path):
    cfg, text = _lsf_script(tmp_path, [DP_ON_MPI, "cluster.mpi_library=mvapich2-gdr"])
    assert rank_env(cfg, tmp_path)["MV2_USE_CUDA"] == "1"
    assert "export MV2_USE_CUDA=1" in text and "--smpiargs" not in text
    cpu = compose_experiment("local_dp", [DP_ON_MPI, "cluster.mpi_library=mvapich2-gdr"])
    assert "MV2_USE_CUDA" not in rank_env(cpu, tmp_path)
