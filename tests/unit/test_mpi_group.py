"""The MPI process group's plumbing on one rank (every torch entry point reaches it) and
the per-dimension router's choice of groups. On one rank a reduction equals its input: the
entry points' values on 2 ranks are tests/integration/test_mpi_group.py, the equality with
gloo on 4 ranks tests/integration/test_mpi_backend.py."""

from __future__ import annotations

import subprocess
import sys

from neoxlab.comm.classify import Grid
from neoxlab.comm.group_backends import GroupRouter
from tests.conftest import REPO_ROOT

ONE_RANK = """
import tempfile, torch, torch.distributed as dist
from neoxlab.comm import mpi_group
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0,
                        world_size=1)
g = dist.new_group([0], backend=mpi_group.register())
assert dist.get_backend(g) == "mpi4py", dist.get_backend(g)
x = torch.arange(6, dtype=torch.float32)
dist.all_reduce(x, group=g)
assert dist.all_reduce(x, group=g, async_op=True).wait()
o = torch.empty(6); dist.all_gather_into_tensor(o, x, group=g); assert torch.equal(o, x)
outs = [torch.empty(6)]; dist.all_gather(outs, x, group=g); assert torch.equal(outs[0], x)
o = torch.empty(6); dist.reduce_scatter_tensor(o, x, group=g); assert torch.equal(o, x)
o = torch.empty(6); dist.all_to_all_single(o, x, group=g); assert torch.equal(o, x)
o = torch.empty(6); dist.all_to_all_single(o, x, [6], [6], group=g); assert torch.equal(o, x)
dist.broadcast(x, src=0, group=g); dist.barrier(group=g); dist.reduce(x, dst=0, group=g)
h = x.to(torch.bfloat16); dist.all_reduce(h, group=g); assert torch.equal(h, x.bfloat16())
y = x.clone(); dist.all_reduce(y, op=dist.ReduceOp.MAX, group=g); assert torch.equal(y, x)
y = x.clone(); dist.all_reduce(y, op=dist.ReduceOp.AVG, group=g); assert torch.equal(y, x)
print("CALLS", mpi_group.summary())
"""


def test_every_torch_entry_point_reaches_the_mpi_group():
    proc = subprocess.run([sys.executable, "-c", ONE_RANK], capture_output=True, text=True,
                          timeout=120, cwd=REPO_ROOT,
                          env={"PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1",
                               "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("CALLS"))
    for op in ("allreduce", "all_gather_single", "allgather", "reduce_scatter_single",
               "all_to_all_single", "broadcast", "barrier", "reduce"):
        assert f"{op} " in line, line


NO_HALF_TYPE = """
import tempfile, torch, torch.distributed as dist
from mpi4py import MPI
half = MPI._typedict["e"]  # what Spectrum MPI, Open MPI 4 and MVAPICH2 2.3 lack
for key in [k for k, v in MPI._typedict.items() if v == half]:
    del MPI._typedict[key]
from neoxlab.comm import mpi_group
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0,
                        world_size=1)
g = dist.new_group([0], backend=mpi_group.register())
for dtype in (torch.float16, torch.bfloat16):
    x = torch.linspace(-3, 3, 6).to(dtype)
    y = x.clone(); dist.broadcast(y, src=0, group=g); assert torch.equal(y, x)
    o = torch.empty(6, dtype=dtype); dist.all_gather_into_tensor(o, x, group=g)
    assert torch.equal(o, x)
    outs = [torch.empty(6, dtype=dtype)]; dist.all_gather(outs, x, group=g)
    assert torch.equal(outs[0], x)
    o = torch.empty(6, dtype=dtype); dist.all_to_all_single(o, x, group=g)
    assert torch.equal(o, x)
    y = x.clone(); dist.all_reduce(y, group=g); assert torch.equal(y, x)
print("HALF OK")
"""


def test_fp16_and_bf16_move_without_an_mpi_half_type():
    """fp16/bf16 that MPI only moves go as 16-bit integers: with the half entries removed
    from mpi4py's type map (as on Spectrum MPI), broadcast and all-gather still work."""
    proc = subprocess.run([sys.executable, "-c", NO_HALF_TYPE], capture_output=True,
                          text=True, timeout=120, cwd=REPO_ROOT,
                          env={"PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1",
                               "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "HALF OK" in proc.stdout


def test_router_knows_each_dimension_by_its_ranks():
    router = GroupRouter(Grid(tp=2, pp=2, dp=2), {"dp": "mpi"})
    assert router.dim_of([0, 2]) == "dp" and router.dim_of([5, 7]) == "dp"
    assert router.dim_of([0, 1]) == "tp"
    assert router.dim_of([1, 5]) == "pp"  # pipe set (also DeepSpeed's p2p pair)
    assert router.dim_of([0, 1, 4, 5]) is None  # DeepSpeed's pipe x model group
    assert router.dim_of(range(8)) is None
    assert router.backends == {"dp": "mpi4py"}
