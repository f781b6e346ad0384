"""compression=auto's re-check on small fixtures: the link estimate, one switch per link
change, none on noise within the margin, every rank switching at the same step, the plan the
model prices and the rules that refuse what cannot re-check."""

from __future__ import annotations

import dataclasses
import json
import random
import threading

import pytest
import torch

from neoxlab.comm import strict
from neoxlab.comm.classify import Classifier, Grid
from neoxlab.comm.compression_rules import validate_compression, validate_online_engine
from neoxlab.comm.online import BASELINE, RECORD_FILE, DimTable, Measured, Option, Recheck
from neoxlab.comm.patch import CompressionPatch
from neoxlab.comm.scheme import DimCompression
from neoxlab.commands.check import problems
from neoxlab.compress import make_compressor
from neoxlab.config.compose import compose_experiment
from neoxlab.engines.builtin.online import OnlineRecheck
from neoxlab.engines.registry import ENGINES
from neoxlab.layout import resolve_layout
from neoxlab.perfmodel.resolve import resolve_profile
from neoxlab.tasks import TASKS
from neoxlab.tune.online import GRID, build_plan

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MBIT = 1e6 / 8 / 1e9  # GB/s of one Mbit/s
MARGIN = 0.2
STEP_BYTES = 4e6  # one dimension's fp32 bytes per step
CODEC_S = 0.1  # int8's codec seconds per step
RATIO = {"none": 1.0, "int8": 4.0}


def fixture_table(profile_mbit: float = 300.0) -> DimTable:
    """A dimension whose model is a bare wire: comm = bytes / bandwidth; int8 sends a quarter
    for CODEC_S of codec time. At 300 Mbit/s it does not pay, at 40 it does."""
    grid = [profile_mbit * MBIT * f for f in GRID]

    def comm(label: str, g: float) -> float:
        return STEP_BYTES / RATIO[label] / (g * 1e9)

    options = []
    for label in ("none", "int8"):
        codec = 0.0 if label == "none" else CODEC_S
        saving = [comm("none", g) - comm(label, g) - codec for g in grid]
        traded = [0.0 if label == "none" else comm("none", g) + comm(label, g) + codec
                  for g in grid]
        options.append(Option(label, {"compressor": label, "params": {}, "min_bytes": 0,
                                      "error_feedback": False},
                              [comm(label, g) for g in grid], [codec] * len(grid), saving,
                              traded))
    return DimTable("dp", "inter", profile_mbit * MBIT, grid, options)


def measure(table: DimTable, label: str, mbit: float, noise: float = 1.0) -> Measured:
    """What a window measures when the link really is `mbit` (the model exact, times noise)."""
    comm, codec = table.predicted(label, mbit * MBIT)
    return Measured(comm * noise, codec, STEP_BYTES / RATIO[label])


def drive(state: Recheck, table: DimTable, links: list[float], noise=lambda: 1.0
          ) -> list[dict[str, str]]:
    """One re-check per entry of `links` (the real link in that window), each measuring the
    codec the dimension runs then; the switches of each."""
    out = []
    for step, mbit in enumerate(links, start=1):
        m = measure(table, state.current["dp"], mbit, noise())
        out.append(state.check(step * 10, {"dp": m}).switches)
    return out


def test_the_fixture_model_prefers_none_at_300_and_int8_at_40():
    t = fixture_table()
    assert t.choose(300 * MBIT, MARGIN) == "none"
    assert t.choose(40 * MBIT, MARGIN) == "int8"


def test_the_link_estimate_inverts_the_model():
    t = fixture_table()
    for mbit in (300.0, 120.0, 40.0):
        for label in ("none", "int8"):
            comm, _ = t.predicted(label, mbit * MBIT)
            assert t.link_for(label, comm) == pytest.approx(mbit * MBIT, rel=0.03)


def test_a_drop_from_300_to_40_switches_exactly_once():
    t = fixture_table()
    state = Recheck({"dp": t}, MARGIN, {"dp": "none"})
    switches = drive(state, t, [300.0] * 5 + [40.0] * 10)
    assert [s for s in switches if s] == [{"dp": "int8"}]
    assert switches.index({"dp": "int8"}) == 5  # the first window on the slower link
    assert state.reference["dp"] == pytest.approx(40 * MBIT, rel=0.03)


def test_noise_within_the_margin_never_switches():
    t = fixture_table()
    rng = random.Random(7)
    for start, mbit in (("none", 300.0), ("int8", 40.0)):
        state = Recheck({"dp": t}, MARGIN, {"dp": start})
        state.reference["dp"] = mbit * MBIT
        switches = drive(state, t, [mbit] * 50, lambda: rng.uniform(0.88, 1.12))
        assert not any(switches)


def test_noise_past_the_margin_is_a_change():
    """The margin is what separates noise from a change: 40 % slower is one."""
    t = fixture_table()
    state = Recheck({"dp": t}, MARGIN, {"dp": "none"})
    checks = state.check(10, {"dp": measure(t, "none", 300.0, 1.4)}).dims
    assert checks[0].changed


def test_a_second_change_switches_a_second_time():
    t = fixture_table()
    state = Recheck({"dp": t}, MARGIN, {"dp": "none"})
    switches = drive(state, t, [300.0] * 3 + [40.0] * 4 + [300.0] * 4)
    assert [s for s in switches if s] == [{"dp": "int8"}, {"dp": "none"}]


def test_a_change_that_keeps_the_codec_moves_the_reference_without_a_switch():
    t = fixture_table()
    state = Recheck({"dp": t}, MARGIN, {"dp": "none"})
    switches = drive(state, t, [300.0, 200.0, 200.0])
    assert not any(switches)
    assert state.reference["dp"] == pytest.approx(200 * MBIT, rel=0.03)


def test_reference_measured_takes_the_first_estimate_without_switching():
    t = fixture_table()
    state = Recheck({"dp": t}, MARGIN, {"dp": "none"}, reference="measured")
    first = state.check(10, {"dp": measure(t, "none", 40.0)})
    assert not first.switches and "reference=measured" in first.note
    assert drive(state, t, [40.0, 40.0]) == [{}, {}]


def test_a_dimension_without_traffic_in_the_window_is_not_checked():
    t = fixture_table()
    state = Recheck({"dp": t}, MARGIN, {"dp": "none"})
    assert state.check(10, {"dp": Measured(0.0, 0.0, 0.0)}).dims == []


# ---- every rank switches at the same step ------------------------------------------------

class ThreadWorld:
    """In-process stand-in for the world group: ranks are threads; all-reduce sums,
    broadcast copies the source's tensor. The group serves one device and, in strict mode
    (comm/strict.py), refuses a tensor on any other, as NCCL does."""

    def __init__(self, size: int, device: torch.device | None = None):
        self.size, self.device = size, device or torch.device("cpu")
        self.barrier = threading.Barrier(size, timeout=30)
        self.slots: list[torch.Tensor | None] = [None] * size

    def member(self, rank: int):
        world = self

        class Member:
            device = world.device

            def all_reduce(self, tensor):
                strict.check_devices("all_reduce", (tensor,), {})
                world.slots[rank] = tensor.clone()
                world.barrier.wait()
                total = sum(world.slots)
                world.barrier.wait()
                tensor.copy_(total)

            def broadcast(self, tensor, src):
                strict.check_devices("broadcast", (tensor,), {})
                world.slots[rank] = tensor.clone()
                world.barrier.wait()
                source = world.slots[src]
                world.barrier.wait()
                tensor.copy_(source)

        return Member()


def fake_patch() -> CompressionPatch:
    none = make_compressor("none")
    return CompressionPatch({"dp": DimCompression(none, 0, False)},
                            Classifier(Grid(tp=1, pp=1, dp=3), hidden_size=8, tokens=8))


def test_every_rank_switches_at_the_same_step(tmp_path):
    """Ranks measure different seconds (rank 2 slowest); the mean decides, rank 0 broadcasts
    the choice and every rank's patch runs int8 from the same step on."""
    t = fixture_table()
    plan = {"recheck_every": 4, "margin": MARGIN, "start": {"dp": "none"},
            "reference": "profile", "dims": {"dp": dataclasses.asdict(t)}}
    world = ThreadWorld(3)
    switched: dict[int, list[tuple[int, dict]]] = {r: [] for r in range(3)}
    policies: dict[int, str] = {}

    def rank_main(rank: int) -> None:
        patch = fake_patch()
        online = OnlineRecheck(plan, patch, rank, tmp_path, world.member(rank),
                               log=lambda *a, **k: None)
        for step in range(1, 17):
            mbit = 300.0 if step <= 8 else 40.0
            label = online.current["dp"]
            comm, _ = t.predicted(label, mbit * MBIT)
            patch.accountant.record("dp", "all_reduce", bytes_in=int(STEP_BYTES),
                                    bytes_out=int(STEP_BYTES / RATIO[label]),
                                    comm_s=comm * (0.9 + 0.1 * rank), group_size=3)
            s = online.after_step(step)
            if s:
                switched[rank].append((step, s))
        policies[rank] = patch.policies["dp"].compressor.name

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads)
    assert switched[0] == switched[1] == switched[2] == [(12, {"dp": "int8"})]
    assert set(policies.values()) == {"int8"}
    records = [json.loads(line) for line in (tmp_path / RECORD_FILE).read_text().splitlines()]
    assert [r["step"] for r in records] == [4, 8, 12, 16]  # rank 0 alone writes them
    assert records[2]["switches"] == {"dp": "int8"} and records[2]["dims"][0]["changed"]


def test_switch_replaces_the_policy_and_drops_residuals_it_will_not_feed_back():
    patch = fake_patch()
    patch.residuals[(0, 4)] = torch.ones(4)
    patch.switch("dp", DimCompression(make_compressor("int8"), 0, True))
    assert patch.policies["dp"].compressor.name == "int8" and patch.residuals
    patch.switch("dp", DimCompression(make_compressor("none"), 0, False))
    assert not patch.policies["dp"].active and not patch.residuals


# ---- the plan and the rules ----------------------------------------------------------------

def auto(*extra: str):
    return compose_experiment("tune_local", ["task=train", "compression=auto", *extra])


def test_the_plan_prices_every_dimension_with_traffic_at_the_tuners_margin():
    cfg = auto("compression.auto.start=model")
    resolved = resolve_profile(cfg)
    plan = build_plan(cfg, resolve_layout(cfg), resolved.profile, resolved.origin)
    assert plan["margin"] == cfg.tune.margin and plan["margin_source"] == cfg.tune.margin_source
    assert set(plan["dims"]) == {"tp", "dp", "zero"}  # pp=1: no traffic
    for dim, d in plan["dims"].items():
        table = DimTable.from_dict(d)
        assert table.option(BASELINE).codec_s[0] == 0.0
        for o in table.options:  # slower link, more wire seconds
            assert o.comm_s[0] > o.comm_s[-1]
        # the start, read off the plan's own numbers at the profile's link (grid factor 1):
        # it clears the margin and saves most of those that do, or none clears it
        i = GRID.index(1.0)
        clear = {o.label: o.saving_s[i] for o in table.options if o.label != BASELINE
                 and o.saving_s[i] > plan["margin"] * o.traded_s[i]}
        start = plan["start"][dim]
        assert start == BASELINE if not clear else clear[start] == max(clear.values())


@pytest.mark.parametrize("gbs, compressed", [(0.0005, True), (1000.0, False)])
def test_the_model_start_compresses_on_a_slow_link_and_not_on_a_fast_one(gbs, compressed):
    cfg = auto("compression.auto.start=model", f"cluster.profile.intra.bandwidth_gbs={gbs}",
               f"cluster.profile.inter.bandwidth_gbs={gbs}")
    resolved = resolve_profile(cfg)
    plan = build_plan(cfg, resolve_layout(cfg), resolved.profile, resolved.origin)
    assert set(plan["start"]) == {"tp", "dp", "zero"}
    assert all((codec != BASELINE) == compressed for codec in plan["start"].values()), plan[
        "start"]


def test_the_given_start_is_kept():
    cfg = auto("compression.auto.start=given", "compression.dims.dp.compressor=zfp",
               "+compression.dims.dp.params.rate=8")
    resolved = resolve_profile(cfg)
    plan = build_plan(cfg, resolve_layout(cfg), resolved.profile, resolved.origin)
    assert plan["start"]["dp"] == "zfp:rate=8" and plan["start"]["tp"] == "none"


def test_an_engine_that_cannot_recheck_is_refused_with_the_fix():
    assert ENGINES["builtin"].rechecks_compression and not ENGINES["neox"].rechecks_compression
    cfg = auto("engine=neox")
    [message] = validate_online_engine(cfg, ENGINES["neox"].rechecks_compression)
    assert "engine=neox" in message and "engine=builtin" in message
    assert message in problems(cfg)
    assert validate_online_engine(auto(), True) == []


@pytest.mark.parametrize("override, words", [
    ("task=omb", "task=omb"),
    ("compression.backend=mpi", "compression.backend=mpi"),
    ("compression.auto.recheck_every=1", "recheck_every=1"),
    ("compression.auto.start=best", "start='best'"),
    ("compression.auto.codecs=[int8]", "lacks 'none'"),
    ("compression.auto.slow_link_from_step=0", "slow_link_from_step=0"),
])
def test_bad_auto_settings_are_refused(override, words):
    cfg = auto(override)
    errors = validate_compression(cfg, TASKS[cfg.task.name].trains)
    assert any(words in e for e in errors), errors


def test_auto_yaml_passes_the_rules():
    assert validate_compression(auto(), trains=True) == []


def test_a_tuned_config_is_the_start_when_there_is_one(tmp_path):
    (tmp_path / "tuned_tune_local.yaml").write_text(
        "scheme: tuned_tune_local\nbackend: framework\npatch: true\nallreduce: auto\n"
        "dims:\n  tp: {compressor: zfp, params: {rate: 12}, min_bytes: 4096}\n")
    cfg = auto(f"tune.config_dir={tmp_path}")
    resolved = resolve_profile(cfg)
    plan = build_plan(cfg, resolve_layout(cfg), resolved.profile, resolved.origin)
    assert plan["start"] == {"tp": "zfp:rate=12", "dp": "none", "zero": "none"}
    assert str(tmp_path) in plan["start_source"]
    missing = auto(f"tune.config_dir={tmp_path / 'none'}")
    plan = build_plan(missing, resolve_layout(missing), resolved.profile, resolved.origin)
    assert "the model's pick" in plan["start_source"]
