"""Rank program for the compressed-collectives test (4 ranks, gloo); writes its checks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from neoxlab.comm import collectives as cc
from neoxlab.compress import make_compressor
from neoxlab.run import dist as neox_dist


def main(out: Path) -> None:
    info = neox_dist.discover()
    dist.init_process_group("gloo")
    me, n = info.rank, info.world_size
    raw = dist  # the plain functions (no patch installed here)
    g = torch.Generator().manual_seed(100 + me)
    checks: dict[str, object] = {}
    none, mpc, zfp = (make_compressor(s) for s in ("none", "mpc", "zfp:rate=8"))

    # integer-valued floats: sums are exact in any order, so results must be bit-identical
    ints = torch.randint(-1000, 1000, (4097,), generator=g).float()
    plain = ints.clone()
    dist.all_reduce(plain)
    algorithms = (("allgather", cc.all_reduce_allgather), ("alltoall", cc.all_reduce_alltoall))
    for name, algo in algorithms:
        for comp in (none, mpc):
            result, _ = algo(raw, comp, ints.clone(), None, n)
            checks[f"all_reduce_{name}_{comp.name}_exact"] = torch.equal(result, plain)

    x = torch.randn(3000, generator=g)
    gathered = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(gathered, x)
    parts, _ = cc.all_gather_tensor(raw, mpc, x, None, n)
    pairs = zip(parts, gathered, strict=True)
    checks["all_gather_mpc_exact"] = all(torch.equal(a, b) for a, b in pairs)

    src_value = torch.randn(2048, generator=torch.Generator().manual_seed(5))
    target = src_value.clone() if me == 1 else torch.zeros(2048)
    result, _ = cc.broadcast(raw, mpc, target, 1, me, None)
    checks["broadcast_mpc_exact"] = torch.equal(result, src_value)

    chunks = torch.randint(-50, 50, (n * 1024,), generator=g).float()
    expected = torch.empty(1024)
    dist.reduce_scatter_tensor(expected, chunks.clone())
    result, _ = cc.reduce_scatter(raw, mpc, chunks, None, n)
    checks["reduce_scatter_mpc_exact"] = torch.equal(result, expected)

    if me in (0, 1):
        if me == 0:
            cc.send(raw, mpc, src_value, 1)
        else:
            got, _ = cc.recv(raw, mpc, torch.empty(2048), 0)
            checks["send_recv_mpc_exact"] = torch.equal(got, src_value)

    grad = torch.randn(1 << 16, generator=g)
    exact = grad.clone()
    dist.all_reduce(exact)
    lossy, cost = cc.all_reduce_alltoall(raw, zfp, grad.clone(), None, n)
    checks["zfp_rel_error"] = float((lossy - exact).norm() / exact.norm())
    checks["zfp_ratio"] = grad.numel() * 4 / cost.bytes_out

    # error feedback: the running sum of compressed results tracks the exact running sum
    residual = torch.zeros_like(grad)
    coarse = make_compressor("zfp:rate=2")
    total_fb, total_plain = torch.zeros_like(grad), torch.zeros_like(grad)
    for _ in range(8):
        r, _ = cc.all_reduce_allgather(raw, coarse, grad + residual, None, n, residual)
        total_fb += r
        r2, _ = cc.all_reduce_allgather(raw, coarse, grad.clone(), None, n)
        total_plain += r2
    truth = exact * 8
    checks["ef_error"] = float((total_fb - truth).norm() / truth.norm())
    checks["no_ef_error"] = float((total_plain - truth).norm() / truth.norm())
    (out / f"rank{me}.json").write_text(json.dumps(checks))
    dist.barrier()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
