"""One rank of the MPI process-group check (run under mpiexec -n 4): every collective the
engines call, on an MPI group and on a gloo group over the same ranks, with the same input;
the results must be equal (bit for bit on integers and 2-rank sums, close on longer sums).
Also our compressed all-reduce over the MPI group, against the same over gloo.
Writes rank<N>.json into the folder given."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from neoxlab.comm import collectives as cc
from neoxlab.comm import mpi_group
from neoxlab.compress import make_compressor
from neoxlab.run.dist import discover


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(a, b))


def main(out: Path) -> None:
    info = discover()
    dist.init_process_group("gloo")
    me, n = info.rank, info.world_size
    mpi_group.register()
    pairs = [[0, 1], [2, 3]]
    everyone = list(range(n))
    mpi_all = dist.new_group(everyone, backend=mpi_group.BACKEND)
    gloo_all = dist.new_group(everyone, backend="gloo")
    mpi_pair = gloo_pair = None
    for ranks in pairs:  # every rank creates every group, as torch requires
        m = dist.new_group(ranks, backend=mpi_group.BACKEND)
        g = dist.new_group(ranks, backend="gloo")
        if me in ranks:
            mpi_pair, gloo_pair = m, g
    gen = torch.Generator().manual_seed(100 + me)
    x = torch.randn(1000, generator=gen)
    r: dict[str, object] = {"backend_name": dist.get_backend(mpi_all)}

    def both(fn) -> tuple[object, object]:
        return fn(mpi_all), fn(gloo_all)

    for op_name in ("SUM", "MAX", "MIN", "AVG", "PRODUCT"):
        op = getattr(dist.ReduceOp, op_name)

        def reduce(group, op=op):
            t = x.clone()
            if op == dist.ReduceOp.AVG and dist.get_backend(group) == "gloo":
                dist.all_reduce(t, group=group)  # gloo has no AVG: sum / n
                return t / n
            dist.all_reduce(t, op=op, group=group)
            return t

        a, b = both(reduce)
        r[f"all_reduce_{op_name}_close"] = bool(torch.allclose(a, b, rtol=1e-6, atol=1e-6))
    ints = torch.arange(10, dtype=torch.int64) * (me + 1)
    a = ints.clone()
    dist.all_reduce(a, group=mpi_all)
    r["all_reduce_int_exact"] = same(a, ints * 0 + torch.arange(10) * sum(range(1, n + 1)))
    for dtype in (torch.float16, torch.bfloat16):
        t = x[:64].to(dtype)
        a, b = t.clone(), t.clone()
        dist.all_reduce(a, group=mpi_pair)
        dist.all_reduce(b, group=gloo_pair)
        r[f"pair_sum_{dtype}_exact"] = same(a, b)
    a, b = x.clone(), x.clone()
    dist.all_reduce(a, group=mpi_pair, async_op=True).wait()
    dist.all_reduce(b, group=gloo_pair)
    r["pair_sum_async_exact"] = same(a, b)

    def gather_into(group):
        out = torch.empty(n * 1000)
        dist.all_gather_into_tensor(out, x, group=group)
        return out

    r["all_gather_into_tensor_exact"] = same(*both(gather_into))

    def gather_list(group):
        outs = [torch.empty(10, 100) for _ in range(n)]
        dist.all_gather(outs, x.view(10, 100), group=group)
        return torch.stack(outs)

    r["all_gather_exact"] = same(*both(gather_list))

    def scatter(group):
        out = torch.empty(1000 // n)
        dist.reduce_scatter_tensor(out, x, group=group)
        return out

    a, b = both(scatter)
    r["reduce_scatter_tensor_close"] = bool(torch.allclose(a, b, rtol=1e-6, atol=1e-6))

    def scatter_list(group):
        out = torch.empty(250)
        dist.reduce_scatter(out, list(x.split(250)), group=group)
        return out

    if hasattr(dist.ProcessGroup, "reduce_scatter"):
        a = scatter_list(mpi_all)
        b = scatter(gloo_all)
        r["reduce_scatter_close"] = bool(torch.allclose(a, b, rtol=1e-6, atol=1e-6))

    def bcast(group):
        t = x.clone()
        dist.broadcast(t, src=2, group=group)
        return t

    r["broadcast_exact"] = same(*both(bcast))

    def alltoall(group):
        t = torch.empty(1000)
        dist.all_to_all_single(t, x, group=group)
        return t

    r["all_to_all_single_exact"] = same(*both(alltoall))

    def alltoall_uneven(group):
        splits = [1 + i for i in range(n)]
        out_splits = [me + 1] * n
        t = torch.empty(sum(out_splits), 3)
        src = torch.arange(sum(splits) * 3, dtype=torch.float32).view(-1, 3) + 100 * me
        dist.all_to_all_single(t, src, out_splits, splits, group=group)
        return t

    r["all_to_all_single_uneven_exact"] = same(*both(alltoall_uneven))

    def reduce_to(group):
        t = x.clone()
        dist.reduce(t, dst=1, group=group)
        return t if me == 1 else torch.zeros(1)

    a, b = both(reduce_to)
    r["reduce_close"] = bool(torch.allclose(a, b, rtol=1e-6, atol=1e-6))
    # p2p inside a pair: group ranks 0 -> 1
    peer = mpi_pair and (pairs[0] if me in pairs[0] else pairs[1])
    t = x.clone()
    if me == peer[0]:
        dist.send(t, dst=peer[1], group=mpi_pair)
        r["send_recv_exact"] = True
    else:
        got = torch.empty(1000)
        dist.recv(got, src=peer[0], group=mpi_pair)
        expect = torch.randn(1000, generator=torch.Generator().manual_seed(100 + peer[0]))
        r["send_recv_exact"] = same(got, expect)
    dist.barrier(group=mpi_all)
    # our compressed all-reduce on the MPI group equals the same algorithm on gloo
    raw = dist  # nothing is patched in this process: torch.distributed itself
    zfp = make_compressor({"name": "zfp", "rate": 8})
    a, b = x.clone(), x.clone()
    cc.all_reduce(raw, zfp, a, mpi_all, n, algorithm="alltoall")
    cc.all_reduce(raw, zfp, b, gloo_all, n, algorithm="alltoall")
    r["compressed_all_reduce_exact"] = same(a, b)
    r["cuda_aware"] = mpi_group.cuda_aware()
    (out / f"rank{me}.json").write_text(json.dumps(r))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
