"""The performance model on an emulated cluster: the uplink model, shared cores, wire time,
and the crossover read from gains."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from neoxlab.config.profile import LinkProfile
from neoxlab.layout import resolve_layout
from neoxlab.perfmodel import emulated as em
from neoxlab.perfmodel import predict
from neoxlab.perfmodel.fit import BANDWIDTH_BENCHMARKS, fit_alpha_beta, steps_and_bytes
from neoxlab.perfmodel.predict import codec_on_path, predict_with, slowdowns


def local():
    """The local cluster's YAML profile (no calibration file under a missing results dir)."""
    return em.local_profile(Path("/nonexistent"))[0]


FITS = {("none", 1, 2): LinkProfile(latency_us=300.0, bandwidth_gbs=1.0),
        ("none", 2, 2): LinkProfile(latency_us=300.0, bandwidth_gbs=0.5),  # 2 x 0.5 together
        ("200", 1, 2): LinkProfile(latency_us=2000.0, bandwidth_gbs=0.0225),  # 0.9 of 25 MB/s
        ("10", 1, 2): LinkProfile(latency_us=4000.0, bandwidth_gbs=0.0011875),  # 0.95 of 1.25
        # two groups at once, each fitted alone: 2 x 0.5 of 1.25 MB/s
        ("10", 2, 2): LinkProfile(latency_us=4000.0, bandwidth_gbs=0.000625)}


FOUR_NODES = ["cluster.nodes=4", "cluster.ranks_per_node=1", "parallel.tp=1"]  # the 4x1 layout


def four_node_links() -> em.UplinkModel:
    """FITS, with the 4-node fits the 4x1 layout needs (as the 2-node ones)."""
    return em.UplinkModel.from_fits(FITS | {(r, 1, 4): FITS[(r, 1, 2)]
                                            for r in ("none", "200", "10")})


def test_uplink_model_scales_the_nominal_rate_by_the_fitted_efficiency():
    links = em.UplinkModel.from_fits(FITS)
    assert links.efficiency == pytest.approx({(1, 2): 0.925, (2, 2): 1.0})
    assert links.latency_us == pytest.approx(3000.0)
    assert links.uplink(40.0).bandwidth_gbs == pytest.approx(0.925 * 40 / 8e3)
    # 2 ranks of a node send at once: each gets half of what 2 flows carry together
    assert links.uplink(40.0, 2).bandwidth_gbs == pytest.approx(1.0 * 40 / 8e3 / 2)
    assert links.uplink(1e6).bandwidth_gbs == pytest.approx(1.0)  # never above the bare veth
    assert links.uplink(None) == dataclasses.replace(FITS[("none", 1, 2)], busy_fraction=1.0,
                                                    full_gbs=1.0)
    # the bare path is bound by the cores; a slower shaped one leaves them idle in part
    assert links.uplink(40.0).busy_fraction == pytest.approx(0.925 * 40 / 8e3 / 1.0)
    assert links.uplink(1e6).busy_fraction == pytest.approx(1.0)
    assert links.uplink(None, 2).bandwidth_gbs == pytest.approx(0.5)
    with pytest.raises(ValueError, match="4 nodes x 1 flow"):  # no bare fit on 4 nodes
        links.uplink(40.0, 1, nodes=4)
    bare_only = em.UplinkModel.from_fits(FITS | {("none", 1, 4): FITS[("none", 1, 2)]})
    with pytest.raises(ValueError, match="no shaped uplink fit with 4 nodes x 1 flow"):
        bare_only.uplink(40.0, 1, nodes=4)
    with pytest.raises(ValueError, match="unshaped"):
        em.UplinkModel.from_fits({("200", 1, 2): FITS[("200", 1, 2)]})


def test_flows_on_the_bare_link_carry_what_their_own_fit_says():
    """The bare link is bound by packet processing on the cores, not by a rate: two flows
    may carry more together than one; their fit says how much."""
    links = em.UplinkModel.from_fits(
        {**FITS, ("none", 2, 2): LinkProfile(latency_us=300.0, bandwidth_gbs=0.7),
         ("none", 1, 4): LinkProfile(latency_us=300.0, bandwidth_gbs=0.8),
         ("200", 1, 4): FITS[("200", 1, 2)]})
    assert links.unshaped_total == pytest.approx({(1, 2): 1.0, (2, 2): 1.4, (1, 4): 0.8})
    assert links.uplink(None, 2).bandwidth_gbs == pytest.approx(0.7)  # not 1.0 / 2
    assert links.uplink(None).bandwidth_gbs == pytest.approx(1.0)
    assert links.uplink(1e6, 2).bandwidth_gbs == pytest.approx(0.7)  # the bare link's cap
    assert links.uplink(40.0, 2).bandwidth_gbs == pytest.approx(1.0 * 40 / 8e3 / 2)
    # 4 nodes sending at once: the cores carry less per uplink, also where the rate is high
    assert links.uplink(None, 1, nodes=4).bandwidth_gbs == pytest.approx(0.8)
    assert links.uplink(1e6, 1, nodes=4).bandwidth_gbs == pytest.approx(0.8)


def test_a_shaped_uplink_carries_what_its_fit_with_as_many_nodes_sending_says():
    """The shaped links' packets go through the same cores as the bare ones: with 4 nodes
    sending, the token bucket's rate is reached less well than with 2."""
    four = {("none", 1, 4): LinkProfile(latency_us=300.0, bandwidth_gbs=0.8),
            ("200", 1, 4): LinkProfile(latency_us=2000.0, bandwidth_gbs=0.0175),  # 0.7
            ("10", 1, 4): LinkProfile(latency_us=4000.0, bandwidth_gbs=0.000875)}  # 0.7
    links = em.UplinkModel.from_fits(FITS | four)
    assert links.efficiency[(1, 4)] == pytest.approx(0.7)
    assert links.uplink(40.0, 1, nodes=4).bandwidth_gbs == pytest.approx(0.7 * 40 / 8e3)
    assert links.uplink(40.0, 1, nodes=2).bandwidth_gbs == pytest.approx(0.925 * 40 / 8e3)
    assert links.latency_us == pytest.approx(3000.0)  # alpha: the 2-node one-flow fits


def test_near_the_bare_cap_the_shaped_rate_and_the_cores_bind_together():
    """4 nodes reach 0.8 of R/8 at 10 Mbit/s but less at 200, where 0.8 x R/8 is nearly
    what their bare link carries: the fitted soft minimum gives both, and a shaping above
    the knee still costs a little."""
    cap, p, share = 0.0215, 6.0, 0.8
    four = {("none", 1, 4): LinkProfile(latency_us=300.0, bandwidth_gbs=cap)}
    four |= {(r, 1, 4): LinkProfile(latency_us=0.0, bandwidth_gbs=em.soft_min(
        share * float(r) / 8e3, cap, p)) for r in ("200", "10")}
    links = em.UplinkModel.from_fits(FITS | four)
    assert links.sharpness == p
    assert links.efficiency[(1, 4)] == pytest.approx(share)
    assert links.efficiency[(1, 2)] == pytest.approx(0.925, rel=1e-3)  # far below its cap
    at_200 = links.uplink(200.0, 1, nodes=4).bandwidth_gbs
    assert at_200 == pytest.approx(four[("200", 1, 4)].bandwidth_gbs)
    assert at_200 < 0.95 * min(share * 200 / 8e3, cap)  # the plain minimum: too fast here
    assert links.uplink(300.0, 1, nodes=4).bandwidth_gbs < cap
    # fits that fall on the plain minimum keep it
    hard = {(r, 1, 4): LinkProfile(latency_us=0.0, bandwidth_gbs=min(share * float(r) / 8e3,
                                                                       cap))
            for r in ("200", "10")}
    assert em.UplinkModel.from_fits(FITS | four | hard).sharpness == math.inf


def test_a_point_fitted_from_repeated_omb_runs_takes_their_median_alpha_and_bandwidth():
    fits = [LinkProfile(latency_us=a, bandwidth_gbs=b)
            for a, b in ((1800.0, 0.021), (500.0, 0.025), (2700.0, 0.019))]
    assert em.median_fit(fits) == LinkProfile(latency_us=1800.0, bandwidth_gbs=0.021)
    assert em.median_fit(fits[:1]) == fits[0]


def sweep_rows(max_size: int, head_bytes: float, fast_gbs: float, slow_gbs: float,
               nodes: int) -> list[dict]:
    """omb rows of a link that carries each message's first head_bytes at fast_gbs and the
    rest at slow_gbs (a shaped uplink before and after its queue overflows), alpha 2 ms."""
    rows = []
    for benchmark in BANDWIDTH_BENCHMARKS:
        for size in (4096 << k for k in range((max_size // 4096).bit_length())):
            steps, wire = steps_and_bytes(benchmark, nodes, size)
            t = steps * 2e-3 + min(wire, head_bytes) / (fast_gbs * 1e9) \
                + max(0.0, wire - head_bytes) / (slow_gbs * 1e9)
            rows.append({"benchmark": benchmark, "size": size, "avg_us": t * 1e6})
    return rows


def test_the_uplink_fit_takes_the_rate_large_messages_sustain_after_the_first_burst():
    # 2 nodes: each message of 1 MiB and up puts its size on the wire, past the head
    rows = sweep_rows(4 << 20, 1 << 20, fast_gbs=0.005, slow_gbs=0.0038, nodes=2)
    assert em.fit_rate(rows).bandwidth_gbs == pytest.approx(0.0038)
    # over every size with alpha >= 0, the fast head puts the bandwidth well above it
    every_size = fit_alpha_beta([(b, 2, [r for r in rows if r["benchmark"] == b], 1.0)
                                 for b in BANDWIDTH_BENCHMARKS])
    assert every_size.bandwidth_gbs > 1.05 * 0.0038
    short = sweep_rows(1 << 20, 1 << 20, fast_gbs=0.005, slow_gbs=0.0038, nodes=2)
    with pytest.raises(ValueError, match="omb.max_size=4194304"):
        em.fit_rate(short)


def test_a_codec_is_slowed_by_its_own_group_and_by_other_groups_off_an_idle_wire():
    # one group of all 4 ranks on 2 cores: they encode at once, whatever the wire
    assert codec_on_path(1.0, 3.0, 2.0, group_share=1.0) == pytest.approx(2.0)
    # two groups of 2: the other group is on the cores as long as its codec lasts
    assert codec_on_path(1.0, 0.0, 2.0, group_share=0.5) == pytest.approx(2.0)
    assert codec_on_path(1.0, 1.0, 2.0, group_share=0.5) == pytest.approx(1.5)
    assert codec_on_path(1.0, 3.0, 2.0, group_share=0.5) == pytest.approx(1.25)
    assert codec_on_path(1.0, 99.0, 2.0, group_share=0.25) == pytest.approx(1.0)  # never < 1
    assert codec_on_path(0.0, 5.0, 2.0) == 0.0


def test_a_slow_shaped_uplink_takes_the_codec_off_the_shared_cores_but_the_bare_one_not():
    links = em.UplinkModel.from_fits(FITS)
    base = local()

    def steps(rate: str) -> tuple[float, float]:
        """naive's step as the uplink is, and as if its wire kept the cores busy."""
        cfg = em.sweep_config("naive", rate, [], "neox_small")
        profile = em.emulated_profile(base, links, None if rate == "none" else float(rate),
                                      2, None)
        busy = dataclasses.replace(profile, inter=dataclasses.replace(profile.inter,
                                                                      busy_fraction=1.0))
        return tuple(predict_with(cfg, resolve_layout(cfg), p, "test").step_s
                     for p in (profile, busy))
    idle, busy = steps("10")
    assert idle < busy  # the other DP group's codec ran beside the wire, not on the cores
    assert steps("none")[0] == pytest.approx(steps("none")[1])  # the bare path is the cores


def test_a_nodes_own_veths_carry_at_the_loaded_bare_fit_and_are_not_slowed_again():
    """2x2: TP stays inside a node, over the same kind of bare veths, while the other node's
    ranks send too; the bare fit with 2 flows at once already ran with 4 ranks on the cores."""
    links = em.UplinkModel.from_fits(FITS)
    cfg = em.sweep_config("none", "none", [], "neox_small")
    profile = em.emulated_profile(local(), links, None, 2, None)
    assert profile.intra.bandwidth_gbs == pytest.approx(0.5)  # ("none", 2, 2), not 1.0
    assert profile.intra.fitted_under_load
    slowed = dataclasses.replace(profile, intra=dataclasses.replace(profile.intra,
                                                                    fitted_under_load=False))
    layout = resolve_layout(cfg)
    loaded, again = (predict_with(cfg, layout, p, "test") for p in (profile, slowed))
    assert loaded.links["tp"] == "intra" and loaded.breakdown["tp"] > 0
    assert loaded.step_s < again.step_s  # slowed twice by 4 ranks on 2 cores otherwise


def test_slower_uplinks_make_compression_pay_and_only_the_wire_grows():
    links = em.UplinkModel.from_fits(FITS)
    base = local()
    gains, steps = [], []
    for rate in ("none", "200", "40", "10"):
        preds = {s: em.predict_point(em.sweep_config(s, rate, [], "neox_small"), base, links,
                                     None, None) for s in ("none", "naive")}
        gains.append(preds["naive"].samples_per_s / preds["none"].samples_per_s - 1)
        steps.append(preds["none"])
    assert gains == sorted(gains)  # the slower the link, the more naive gains
    assert gains[0] < 0 < gains[-1]
    # the DP reduction crosses the uplink; its time grows as the rate falls, compute does not
    assert all(p.links["dp"] == "inter" and p.links["tp"] == "intra" for p in steps)
    assert steps[-1].breakdown["dp"] > 10 * steps[1].breakdown["dp"]
    slow, fast = steps[-1], steps[1]
    assert (slow.breakdown["compute"] / slow.slowdown
            == pytest.approx(fast.breakdown["compute"] / fast.slowdown))


def test_emulated_nodes_share_the_machine_cores():
    # 2 emulated nodes x 2 ranks run on the machine's 2 cores: 4 ranks share them (the
    # cluster's cores_per_node is the machine's), not 2 per node
    from neoxlab.layout import resolve_layout

    cfg = em.sweep_config("none", "none", [], "neox_small")
    assert slowdowns(cfg, resolve_layout(cfg), local(), None) == (2.0, 2.0)


def test_the_bare_link_stands_on_the_rate_axis_where_a_shaped_uplink_carries_as_much():
    links = four_node_links()
    rate = links.bare_rate_mbit(1, 2)
    assert rate == pytest.approx(1.0 / 0.925 * 8e3)
    assert links.uplink(rate).bandwidth_gbs == pytest.approx(links.uplink(None).bandwidth_gbs)
    assert links.uplink(rate / 2).bandwidth_gbs == pytest.approx(0.5)
    with pytest.raises(ValueError, match="3 nodes x 1 flow"):
        links.bare_rate_mbit(1, 3)


def test_measured_gains_sit_at_the_rate_their_uplink_behaves_as():
    rows = [{"rate_mbit": r, "gain_samples": g}
            for r, g in (("none", -0.08), ("300", 0.14), ("40", 0.9))]
    # the bare link at 350 Mbit/s: 2x2 zhybrid crosses between it and 300
    rates, gains = em.rated_gains(rows, bare_rate=350.0)
    assert rates == [40.0, 300.0, 350.0] and gains == [0.9, 0.14, -0.08]
    assert 300 < em.crossover(rates, gains) < 350
    # the bare link at 250: 300 Mbit/s does not bind, both measured the same link
    rates, gains = em.rated_gains(rows, bare_rate=250.0)
    assert rates == [40.0, 250.0] and gains == pytest.approx([0.9, 0.03])
    assert em.crossover(rates, gains) is None  # pays everywhere


def test_crossover_interpolates_on_log_rate():
    assert em.crossover([1000, 100, 10], [-0.5, -0.1, 0.3]) == pytest.approx(
        math.exp(math.log(100) + 0.25 * (math.log(10) - math.log(100))))
    assert em.crossover([1000, 10], [0.1, 0.2]) is None  # pays everywhere
    assert em.crossover([1000, 10], [-0.1, -0.2]) is None  # nowhere


def test_codecs_scaled_to_the_fit_rate_runs_slow_every_codec_by_the_time_weighted_ratio():
    assert em.codec_scale([0.6, 0.2], [0.3, 0.1]) == pytest.approx(2.0)
    assert em.codec_scale([1.0, 0.1], [0.5, 0.5]) == pytest.approx(1.1)  # by time, not mean
    with pytest.raises(ValueError, match="fit rate"):
        em.codec_scale([], [])
    codecs = local().codecs
    slower = em.scaled_codecs(codecs, 2.0)
    assert set(slower) == set(codecs)
    for name, c in codecs.items():
        assert slower[name].encode_gbs == pytest.approx(c.encode_gbs / 2)
        assert slower[name].decode_gbs == pytest.approx(c.decode_gbs / 2)
        assert slower[name].call_us == pytest.approx(c.call_us * 2)
        assert slower[name].ratio == c.ratio
    cfg = em.sweep_config("naive", "40", FOUR_NODES, "neox_small")
    links = four_node_links()
    base = local()
    one, two = (em.predict_point(cfg, base, links, c, None) for c in (codecs, slower))
    assert two.codec_path_s == pytest.approx(2 * one.codec_path_s, rel=0.05)
    assert two.step_s > one.step_s


def test_transfers_that_keep_a_shaped_uplink_full_get_its_rate_less_the_tcp_headers():
    """A gather to one rank, or payloads sent one at a time: the shaped rate less the TCP/IP
    headers of full segments, above the ring collectives' fitted efficiency and never above
    what one flow got on the bare link."""
    links = em.UplinkModel.from_fits(FITS)
    assert links.uplink(40.0).full_gbs == pytest.approx(40 / 8e3 * 1448 / 1514, rel=0.01)
    assert links.uplink(40.0).full_gbs > links.uplink(40.0).bandwidth_gbs  # 0.957, not 0.925
    assert links.uplink(1e6).full_gbs < FITS[("none", 1, 2)].bandwidth_gbs * 1.001
    owners = em.predict_point(em.sweep_config("naive", "40",
                                              FOUR_NODES + ["zero.reduce_to_owner=true"],
                                              "neox_small"), local(), four_node_links(), None,
                              None)
    assert owners.notes == [] and owners.breakdown["dp"] > 0


def test_a_reduce_to_owners_codecs_run_apart_not_in_lockstep(monkeypatch):
    """Its payloads cross one at a time, so the group's ranks reach their DP codecs apart:
    behind a slow uplink a codec runs at its one-thread time, where the all-reduce's group
    encodes at once and is slowed by every rank on the cores."""
    calls: list[tuple[float, float]] = []
    real = predict.codec_on_path

    def recorded(codec_s, idle_wire_s, slow_path, group_share=1.0):
        out = real(codec_s, idle_wire_s, slow_path, group_share)
        calls.append((codec_s, out))
        return out
    monkeypatch.setattr(predict, "codec_on_path", recorded)

    def dp_codec(owner: bool) -> tuple[float, float]:
        calls.clear()
        cfg = em.sweep_config("naive", "10", FOUR_NODES + [f"zero.reduce_to_owner={owner}"],
                              "neox_small")
        em.predict_point(cfg, local(), four_node_links(), None, None)
        return calls[-2]  # tp, pp, dp, zero
    one_thread, on_path = dp_codec(owner=False)
    assert on_path > 1.5 * one_thread  # 4 ranks on 2 cores, encoding together
    one_thread, on_path = dp_codec(owner=True)
    assert one_thread > 0 and on_path == pytest.approx(one_thread)



def test_a_run_cut_short_is_not_fitted(tmp_path, monkeypatch):
    """A killed emulated_omb run leaves a partial omb.jsonl: the finder skips it, and a sweep
    without a benchmark's rows is refused by name rather than failing inside the solver."""
    import json
    from types import SimpleNamespace

    from neoxlab.config.schema import ConfigError

    root = tmp_path / "emulated_omb"
    for name, state in (("a", "completed"), ("b", "failed")):
        (root / name).mkdir(parents=True)
        (root / name / "omb.jsonl").write_text("")
        (root / name / "status.json").write_text(json.dumps({"state": state}))
    cfg = SimpleNamespace(cluster=SimpleNamespace(emulated=SimpleNamespace(
        inter=SimpleNamespace(rate_mbit=40.0)), nodes=2), omb=SimpleNamespace(groups=1))
    monkeypatch.setattr(em.rundir, "load_config", lambda run_dir: cfg)
    assert em.find_omb_runs(root) == {("40", 1, 2): [root / "a"]}
    with pytest.raises(ConfigError, match="run cut short"):
        em.fit_rate([])
    # one benchmark's sweep alone is a fit (omb.benchmarks=[allreduce])
    rows = sweep_rows(4 << 20, 1 << 20, fast_gbs=0.005, slow_gbs=0.0038, nodes=2)
    one = [r for r in rows if r["benchmark"] == BANDWIDTH_BENCHMARKS[0]]
    assert em.fit_rate(one).bandwidth_gbs == pytest.approx(0.0038)
