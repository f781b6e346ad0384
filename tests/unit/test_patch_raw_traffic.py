"""Traffic a codec cannot shrink goes raw through the patch (issue 52 item 7).

zhybrid sends TP through ZFP rate 24: 3 bytes a value, more than bf16's 2. Two real gloo
ranks in two processes: a bf16 TP all-reduce under that policy must be one plain
torch.distributed.all_reduce (no all-to-all + fp32 sum + all-gather), accounted as raw; an
fp32 one (rate 24 < 32 bits) still goes compressed. At start-up one line names the
dimensions left raw and why.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import socket

import pytest
import torch
import torch.distributed as dist

from neoxlab.comm.classify import Classifier, Grid
from neoxlab.comm.install import raw_dims_line
from neoxlab.comm.patch import CompressionPatch
from neoxlab.comm.scheme import DimCompression
from neoxlab.compress import make_compressor
from neoxlab.config.compose import compose_experiment

NUMEL = 1 << 14  # 32 KiB of bf16: above min_bytes
TIMEOUT_S = 120


def _rank(rank: int, port: int, out: mp.Queue) -> None:
    """Rank `rank` of 2: a TP all-reduce in bf16, then one in fp32, under zhybrid's TP
    policy; per call what reached torch.distributed beneath the patch and the accounting."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    underlying = {"all_reduce": 0, "all_gather_into_tensor": 0, "all_to_all_single": 0}
    for name in underlying:  # count what reaches torch.distributed beneath the patch
        setattr(dist, name, _counting(getattr(dist, name), name, underlying))
    policies = {"tp": DimCompression(make_compressor("zfp:rate=24"), 4096, False)}
    results = {}
    for dtype in (torch.bfloat16, torch.float32):
        underlying.update(dict.fromkeys(underlying, 0))
        patch = CompressionPatch(policies, Classifier(Grid(tp=2, pp=1, dp=1))).install()
        try:
            x = torch.randn(NUMEL, generator=torch.Generator().manual_seed(rank)).to(dtype)
            want = sum(torch.randn(NUMEL, generator=torch.Generator().manual_seed(r))
                       .to(dtype).float() for r in range(2))
            dist.all_reduce(x)
        finally:
            patch.uninstall()
        s = patch.accountant.stats[("tp", "all_reduce")]
        results[str(dtype)] = (dict(underlying), s.calls, s.compressed_calls, s.bytes_in,
                               s.bytes_out, float((x.float() - want).abs().max()))
    out.put((rank, results))
    dist.destroy_process_group()


def _counting(original, name: str, counts: dict[str, int]):
    """original, counting its calls (same signature: the patch binds arguments by it)."""
    @functools.wraps(original)
    def counted(*args, **kwargs):
        counts[name] += 1
        return original(*args, **kwargs)

    return counted


def run_two_ranks() -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=TIMEOUT_S)
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0], "a rank failed or hung (its stderr above)"
    return [results for _, results in sorted(out.get(timeout=5) for _ in procs)]


@pytest.fixture(scope="module")
def two_ranks() -> list[dict]:
    return run_two_ranks()


def test_a_bf16_zhybrid_tp_all_reduce_is_one_raw_all_reduce(two_ranks):
    for rank, results in enumerate(two_ranks):
        underlying, calls, compressed, bytes_in, bytes_out, err = results["torch.bfloat16"]
        assert underlying["all_reduce"] == 1, (rank, underlying)
        assert underlying["all_gather_into_tensor"] == underlying["all_to_all_single"] == 0
        assert (calls, compressed) == (1, 0), "accounted as raw"
        assert bytes_out == bytes_in == NUMEL * 2
        assert err <= 2.0**-7 * 8  # bf16's own rounding of the sum, nothing more


def test_an_fp32_tp_all_reduce_under_the_same_policy_stays_compressed(two_ranks):
    for rank, results in enumerate(two_ranks):
        underlying, calls, compressed, bytes_in, bytes_out, _ = results["torch.float32"]
        assert underlying["all_reduce"] == 0, (rank, underlying)
        assert (calls, compressed) == (1, 1)
        assert bytes_out < bytes_in


def test_start_up_names_the_dimensions_left_raw_and_why():
    """zhybrid on bf16: TP, PP and ZeRO (rate 24) are left raw; DP (rate 8) is not."""
    cfg = compose_experiment("local_dp", ["compression=zhybrid", "train.precision=bf16"])
    line = raw_dims_line(cfg)
    assert line is not None and "\n" not in line
    assert line.endswith("pp, tp, zero: zfp(rate=24) cannot shrink bfloat16 values "
                         "(24 bits a value for 16)")
    assert "dp" not in line
    fp32 = compose_experiment("local_dp", ["compression=zhybrid", "train.precision=fp32"])
    assert raw_dims_line(fp32) is None
