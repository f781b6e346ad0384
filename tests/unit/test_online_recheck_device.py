"""compression=auto's re-check on a GPU world: its tensors on the world group's device (an NCCL
group refuses host tensors), and a failure of rank 0's decision reaching every rank instead of
leaving them waiting in the broadcast.

On a CPU machine the device rule is checked the strict-device way (neoxlab.comm.strict): the
re-check runs under torch's default device `meta`, and the group refuses any tensor that is
not on the device it serves, as NCCL refuses a host tensor. The failure is checked on 3 real
gloo processes, with a process-group timeout and a join timeout."""

from __future__ import annotations

import dataclasses
import datetime
import threading
import traceback
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from neoxlab.comm import strict
from neoxlab.comm.online import RECORD_FILE
from neoxlab.engines.builtin.online import OnlineRecheck, RecheckFailed, group_device
from tests.unit.test_tune_online import (
    MBIT,
    RATIO,
    STEP_BYTES,
    ThreadWorld,
    fake_patch,
    fixture_table,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def plan() -> dict:
    return {"recheck_every": 2, "margin": 0.2, "start": {"dp": "none"},
            "reference": "profile", "dims": {"dp": dataclasses.asdict(fixture_table())}}


def run_steps(online: OnlineRecheck, patch, steps: int) -> None:
    for step in range(1, steps + 1):
        label = online.current["dp"]
        comm, _ = online.tables["dp"].predicted(label, 40.0 * MBIT)
        patch.accountant.record("dp", "all_reduce", bytes_in=int(STEP_BYTES),
                                bytes_out=int(STEP_BYTES / RATIO[label]), comm_s=comm,
                                group_size=2)
        online.after_step(step)


def test_the_recheck_hands_the_group_only_tensors_on_its_device(tmp_path):
    """Every tensor the re-check all-reduces or broadcasts names the group's device: under
    default device meta, one allocated without `device=` is refused."""
    world = ThreadWorld(2, torch.device("cpu"))
    errors: dict[int, str] = {}
    current: dict[int, str] = {}

    def rank_main(rank: int) -> None:
        try:
            patch = fake_patch()
            online = OnlineRecheck(plan(), patch, rank, tmp_path, world.member(rank),
                                   log=lambda *a, **k: None)
            with strict.payload_device(world.device, strict=True):
                run_steps(online, patch, 4)
            current[rank] = online.current["dp"]
        except Exception:
            errors[rank] = traceback.format_exc().strip().splitlines()[-1]

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads)
    assert errors == {}
    assert current == {0: "int8", 1: "int8"}  # the re-check ran to a switch at 40 Mbit/s


def test_the_world_groups_device_follows_its_backend():
    assert group_device("nccl") == torch.device("cuda")
    assert group_device("cuda:nccl,cpu:gloo") == torch.device("cuda")
    assert group_device("gloo") == torch.device("cpu")
    assert group_device("mpi") == torch.device("cpu")


def _rank(rank: int, size: int, store: str, run_dir: str, out: str) -> None:
    """One gloo process: rank 0's tune_online.jsonl is a directory, so its decision raises."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=40))
    patch = fake_patch().install()
    try:
        online = OnlineRecheck(plan(), patch, rank, Path(run_dir), log=lambda *a, **k: None)
        run_steps(online, patch, 2)
        outcome = "no error"
    except Exception as e:
        outcome = f"{type(e).__name__}: {e}"
    Path(out, f"rank{rank}.txt").write_text(outcome)


def test_a_failed_decision_on_rank_0_stops_every_rank(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / RECORD_FILE).mkdir(parents=True)  # rank 0 cannot append its record
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, 3, str(tmp_path / "store"), str(run_dir),
                                             str(tmp_path))) for r in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=90)
    alive = [p.pid for p in procs if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert alive == [], "ranks still waiting after 90 s"
    outcomes = {r: (tmp_path / f"rank{r}.txt").read_text() for r in range(3)}
    assert outcomes[0].startswith("IsADirectoryError"), outcomes
    for r in (1, 2):
        assert outcomes[r].startswith(RecheckFailed.__name__), outcomes
        assert "rank 0's re-check after step 2 failed" in outcomes[r]
