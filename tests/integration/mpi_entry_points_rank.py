"""One rank of the MPI process group's entry-point check (run under mpiexec -n 2): every
torch.distributed entry point the engines call, on a group of backend "mpi4py" over both
ranks, with the small rank-dependent input INPUTS[rank]. Writes rank<N>.json into the folder
given: each call's result as a list, and the collectives the MPI group counted.
test_mpi_group.py holds the expected values."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from neoxlab.comm import mpi_group
from neoxlab.run.dist import discover

INPUTS = {0: [1.0, 6.0, 2.0, 7.0, 3.0, 8.0], 1: [5.0, 2.0, 6.0, 1.0, 7.0, 0.0]}
# all_to_all_single with uneven splits: elements each rank sends to rank 0 and rank 1
SEND_SPLITS = {0: [2, 4], 1: [3, 3]}


def results(me: int, group) -> dict[str, list]:
    x = torch.tensor(INPUTS[me])
    out: dict[str, list] = {}
    for op in ("SUM", "MAX", "MIN", "AVG", "PRODUCT"):
        t = x.clone()
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group)
        out[f"all_reduce_{op}"] = t.tolist()
    t = x.clone()
    dist.all_reduce(t, group=group, async_op=True).wait()
    out["all_reduce_async"] = t.tolist()
    t = x.to(torch.bfloat16)
    dist.all_reduce(t, group=group)
    out["all_reduce_bf16"] = t.float().tolist()
    t = torch.empty(12)
    dist.all_gather_into_tensor(t, x, group=group)
    out["all_gather_into_tensor"] = t.tolist()
    parts = [torch.empty(6), torch.empty(6)]
    dist.all_gather(parts, x, group=group)
    out["all_gather"] = [p.tolist() for p in parts]
    t = torch.empty(3)
    dist.reduce_scatter_tensor(t, x, group=group)
    out["reduce_scatter_tensor"] = t.tolist()
    t = torch.empty(3)
    dist.reduce_scatter(t, list(x.split(3)), group=group)
    out["reduce_scatter"] = t.tolist()
    t = torch.empty(6)
    dist.all_to_all_single(t, x, group=group)
    out["all_to_all_single"] = t.tolist()
    receive = [SEND_SPLITS[peer][me] for peer in (0, 1)]
    t = torch.empty(sum(receive))
    dist.all_to_all_single(t, x, receive, SEND_SPLITS[me], group=group)
    out["all_to_all_single_uneven"] = t.tolist()
    t = x.clone()
    dist.broadcast(t, src=1, group=group)
    out["broadcast_from_1"] = t.tolist()
    t = x.clone()
    dist.reduce(t, dst=1, group=group)
    if me == 1:  # the other rank's buffer is unspecified after a reduce
        out["reduce_to_1"] = t.tolist()
    if me == 0:
        dist.send(x, dst=1, group=group)
    else:
        t = torch.zeros(6)
        dist.recv(t, src=0, group=group)
        out["recv_from_0"] = t.tolist()
    dist.barrier(group=group)
    return out


def main(folder: Path) -> None:
    info = discover()
    dist.init_process_group("gloo")
    group = dist.new_group([0, 1], backend=mpi_group.register())
    report = {"backend": dist.get_backend(group), "results": results(info.rank, group),
              "calls": dict(mpi_group.CALLS)}
    (folder / f"rank{info.rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
