"""Compression inside a real 8-rank TP=2/PP=2/DP=2 ZeRO-1 run, in strict-device mode: every
tensor a compressed collective hands to torch.distributed must sit on its payload's device
(neoxlab.comm.strict), which is what an NCCL group demands. The none and mzhybrid runs are
members of the session's strict-device local_compare run (conftest `compare_run`)."""

from __future__ import annotations

import json

import pytest

from neoxlab.comm.strict import STRICT_ENV
from tests.integration.harness import (
    CHECKPOINT_EVERY,
    COMPARE_STEPS,
    read_metrics,
    read_status,
    run_experiment,
)

# the unpatched and lossless runs compare step by step with "none": same steps, same
# checkpoints (local_compare's members save after steps 5 and 10)
STEPS = COMPARE_STEPS
# lossless MPC on TP, PP and DP, whose ZeRO-1 gradient partitions are reduced to their owners
# (a compressed reduce that only the owner decodes): the sum of DP=2 terms is exact
MPC_EVERYWHERE_BUT_ZERO = [
    "compression=custom", "compression.dims.dp.compressor=mpc", "~compression.dims.dp.params.rate",
    "compression.dims.dp.error_feedback=false", "compression.dims.tp.compressor=mpc",
    "compression.dims.pp.compressor=mpc", "zero.reduce_to_owner=true"]
# the first test's set-up may make the session's local_compare run (4 launches, at most
# 900 s) before this module's own 2 launches
pytestmark = pytest.mark.timeout(1500)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, compare_run):
    root = tmp_path_factory.mktemp("results")
    variants = {
        "unpatched": ("local_baseline", ["compression.patch=false"]),
        "mpc_reduced": ("local_baseline", MPC_EVERYWHERE_BUT_ZERO),
    }
    out = {"none": compare_run.member("local_baseline"),
           "mzhybrid": compare_run.member("local_mzhybrid")}
    for run_dir in out.values():
        assert read_status(run_dir)["state"] == "completed"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(STRICT_ENV, "1")  # the rank processes inherit it
        for key, (experiment, overrides) in variants.items():
            proc, run_dir = run_experiment(experiment, root / key, f"train.steps={STEPS}",
                                           f"train.checkpoint_every={CHECKPOINT_EVERY}",
                                           *overrides)
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
            assert read_status(run_dir)["state"] == "completed"
            out[key] = run_dir
    return out


def losses(run_dir):
    return [r["loss"] for r in read_metrics(run_dir)]


def comm_totals(run_dir):
    return json.loads((run_dir / "summary.json").read_text())["comm"]


def test_scheme_none_with_patch_is_bit_identical_to_no_patch(runs):
    assert len(losses(runs["none"])) == STEPS
    assert losses(runs["none"]) == losses(runs["unpatched"])
    assert not (runs["unpatched"] / "comm.jsonl").exists()


def test_lossless_mpc_on_tp_pp_and_reduced_dp_is_bit_identical(runs):
    totals = comm_totals(runs["mpc_reduced"])
    assert totals["tp"]["compressed_calls"] > 0 and totals["pp"]["compressed_calls"] > 0
    assert totals["dp"]["compressed_calls"] > 0
    rows = [json.loads(line)
            for line in (runs["mpc_reduced"] / "comm.jsonl").read_text().splitlines()]
    dp_ops = {r["op"] for r in rows if r["dim"] == "dp" and r["compressor"] != "none"}
    assert dp_ops == {"reduce"}, dp_ops  # no gradient all-reduce: each owner got its part
    assert losses(runs["mpc_reduced"]) == losses(runs["none"])


def test_every_dimension_went_through_the_wrapper(runs):
    totals = comm_totals(runs["mzhybrid"])
    for dim in ("dp", "zero", "tp", "pp"):
        assert totals[dim]["calls"] > 0 and totals[dim]["bytes_in"] > 0, dim
        assert totals[dim]["compressed_calls"] > 0, dim
    assert totals["other"]["compressed_calls"] == 0
    rows = [json.loads(line) for line in (runs["mzhybrid"] / "comm.jsonl").read_text().splitlines()]
    assert {r["rank"] for r in rows} == set(range(8))
    assert any(r["via_deepspeed"] for r in rows if r["dim"] == "dp")  # DeepSpeed's path
    assert any(not r["via_deepspeed"] for r in rows if r["dim"] == "tp")  # Megatron's path


def test_dp_bytes_shrink_by_the_zfp_rate(runs):
    dp = comm_totals(runs["mzhybrid"])["dp"]
    assert dp["bytes_in"] / dp["bytes_out"] == pytest.approx(32 / 8, rel=0.05)


def test_lossy_dp_changes_the_trajectory_but_still_trains(runs):
    lossy, base = losses(runs["mzhybrid"]), losses(runs["none"])
    assert lossy != base
    assert lossy[-1] < lossy[0]
