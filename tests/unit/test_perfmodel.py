"""The performance model's parts against hand-computed numbers, and its refusals."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys

import pytest
import torch

from neoxlab import metrics
from neoxlab.commands.calibrate import fit_compute
from neoxlab.config import ConfigError
from neoxlab.config.compose import compose_experiment
from neoxlab.config.profile import CodecProfile, LinkProfile, PerfProfile
from neoxlab.layout import resolve_layout
from neoxlab.perfmodel import costs, traffic
from neoxlab.perfmodel.fit import fit_alpha_beta
from neoxlab.perfmodel.predict import (
    COMPONENTS,
    codec_for,
    latencies_only,
    predict,
    slowdowns,
)
from neoxlab.perfmodel.resolve import resolve_profile
from neoxlab.perfmodel.stretch import Load
from neoxlab.perfmodel.topology import crosses_nodes
from tests.conftest import REPO_ROOT

LINK = LinkProfile(latency_us=10.0, bandwidth_gbs=2.0)


def test_tp_allreduce_count_matches_the_accounting_of_a_real_run():
    # local_3d (tp2 pp2 dp2, 4 micro-batches, 2 layers a stage): the comm accounting of a
    # run showed 12 TP all-reduces per micro-batch on the last stage: 2 layers x (2 forward
    # + 2 backward) + the LM head's backward + 3 cross-entropy scalars.
    cfg = compose_experiment("local_3d")
    msgs = [m for m in traffic.messages(cfg, resolve_layout(cfg)) if m.dim == "tp"]
    reduces = sum(m.count for m in msgs if m.op == "all_reduce")
    assert reduces == 2 * 4 + 1 + 3
    act = 1 * 64 * 64 * 4  # micro_batch x seq x hidden x fp32
    assert {m.nbytes for m in msgs if m.op == "all_reduce"} == {act, 64 * 4}


def test_every_tp_allreduce_over_min_bytes_is_coded_async_backward_ones_too():
    # megatron-core's backward TP all-reduces are async; the framework patch compresses them
    # as well (a 2x2 emulated zhybrid run: 26 TP calls a step, all compressed); the
    # cross-entropy scalars are under min_bytes and go raw
    cfg = compose_experiment("local_3d", ["compression=zhybrid"])
    profile = PerfProfile(codecs={"zfp:rate=24": CodecProfile(), "zfp": CodecProfile(),
                                  "mpc": CodecProfile()})
    coded = raw = 0
    for m in traffic.messages(cfg, resolve_layout(cfg)):
        if m.dim == "tp" and m.op == "all_reduce":
            if codec_for(cfg, profile, m, []) is None:
                raw += m.count
            else:
                coded += m.count
    assert (coded, raw) == (2 * 4 + 1, 3)


def test_checkpointing_adds_the_recomputed_forward_allreduces():
    plain = compose_experiment("local_3d")
    ckpt = compose_experiment("local_3d", ["parallel.activation_checkpointing=true"])

    def full_size(cfg):
        return sum(m.count for m in traffic.messages(cfg, resolve_layout(cfg))
                   if m.dim == "tp" and m.op == "all_reduce" and m.nbytes > 1024)

    assert full_size(ckpt) - full_size(plain) == 2 * 2  # 2 layers x 2 forward all-reduces


def test_dp_and_zero_bytes_follow_the_stage_parameters():
    cfg = compose_experiment("baseline_192gpu")
    layout = resolve_layout(cfg)
    msgs = traffic.messages(cfg, layout)
    dp_bytes = sum(m.nbytes * m.count for m in msgs if m.dim == "dp")
    # 11 layers of 12 h^2 + 13 h parameters and the head (vocabulary 50277 padded to a
    # multiple of 64 x tp = 256: the published 50432 rows of h), over tp 4, 2 bytes each (fp16)
    h = 6144
    params = (11 * (12 * h * h + 13 * h) + 50432 * h) // 4
    assert dp_bytes == pytest.approx(params * 2, rel=1e-6)
    assert {m.op for m in msgs if m.dim == "zero"} == {"all_gather"}


def test_alpha_beta_formulas():
    ar = traffic.Message("tp", "all_reduce", 4e6, 4, 1, "microbatch", 16)
    assert costs.plain(ar, LINK) == pytest.approx(6 * 10e-6 + 2 * 3 / 4 * 4e6 / 2e9)
    ag = traffic.Message("zero", "all_gather", 4e6, 4, 1, "step", 16)
    assert costs.plain(ag, LINK) == pytest.approx(3 * 10e-6 + 3 / 4 * 4e6 / 2e9)
    p2p = traffic.Message("pp", "p2p", 4e6, 2, 1, "microbatch", 16)
    assert costs.plain(p2p, LINK) == pytest.approx(10e-6 + 4e6 / 2e9)
    gloo_like = dataclasses.replace(LINK, p2p_latency_us=1.0)
    assert costs.plain(p2p, gloo_like) == pytest.approx(1e-6 + 4e6 / 2e9)
    assert costs.plain(ar, gloo_like) == costs.plain(ar, LINK)


def test_compression_divides_bytes_and_pays_the_codec():
    codec_p = CodecProfile(encode_gbs=10.0, decode_gbs=20.0, call_us=0.0)
    msg = traffic.Message("pp", "p2p", 8e6, 2, 1, "microbatch", 32)
    cost = costs.message_cost(msg, LINK, costs.Codec("zfp", 4.0, codec_p, 4096))
    assert cost.comm_s == pytest.approx(2 * 10e-6 + 2e6 / 2e9)
    assert cost.codec_s == pytest.approx(8e6 / 10e9 + 8e6 / 20e9)
    small = dataclasses.replace(msg, nbytes=1000)  # below min_bytes: untouched
    assert costs.message_cost(small, LINK, costs.Codec("zfp", 4.0, codec_p, 4096)).codec_s == 0


def test_reducing_to_owners_runs_the_parts_one_after_another_and_gathers_at_the_full_rate():
    """zero.reduce_to_owner: DP buckets as n reduces of their parts, one after another. Plain
    (gloo): a ring reduce-scatter of each part at the link's rate, then a gather of its pieces
    to the owner at the full rate; compressed: every payload of every segment on its own, one
    after another, at the full rate; only the own part's n payloads decoded."""
    cfg = compose_experiment("local_zhybrid", ["zero.reduce_to_owner=true"])
    assert {m.op for m in traffic.messages(cfg, resolve_layout(cfg)) if m.dim == "dp"} == \
        {"reduce_to_owners"}
    owners = traffic.Message("dp", "reduce_to_owners", 8e6, 4, 1, "step", 32)
    part = 8e6 / 4
    full = dataclasses.replace(LINK, full_gbs=4.0)
    # per part: 3 ring steps moving 3/4 of it at 2 GB/s, then 3/4 of it gathered at 4 GB/s
    one_part = 3 * 10e-6 + 3 / 4 * part / 2e9 + 10e-6 + 3 / 4 * part / 4e9
    assert costs.plain(owners, full) == pytest.approx(4 * one_part)
    whole = dataclasses.replace(owners, op="all_reduce")
    no_alpha = dataclasses.replace(LINK, latency_us=0.0)  # without B_full: an all-reduce's wire
    assert costs.plain(owners, no_alpha) == pytest.approx(costs.plain(whole, no_alpha))
    codec = costs.Codec("zfp", 4.0, CodecProfile(encode_gbs=10.0, decode_gbs=20.0,
                                                 call_us=0.0), 4096)
    ours = costs.message_cost(owners, full, codec)
    # the 2 MB parts go in 2 segments (1 MiB each at most): 4 owners x 3 senders x 2
    payloads = 4 * 3 * 2
    assert ours.comm_s == pytest.approx(2 * payloads * 10e-6 + payloads * (part / 2 / 4) / 4e9)
    assert ours.codec_s == pytest.approx(8e6 / 10e9 + 8e6 / 20e9)
    assert costs.message_cost(owners, LINK, codec).comm_s > ours.comm_s  # 2 GB/s, not 4
    assert ours.codec_s < costs.message_cost(whole, full, codec).codec_s


def test_zfp_ratio_depends_on_the_element_width():
    from neoxlab.perfmodel.predict import codec_ratio

    assert codec_ratio("zfp", {"rate": 8}, 32, None) == 4.0
    assert codec_ratio("zfp", {"rate": 8}, 16, None) == 2.0
    assert codec_ratio("zfp", {"rate": 24}, 16, None) < 1.0  # sent raw
    with pytest.raises(ConfigError, match="data-dependent"):
        codec_ratio("mpc", {}, 16, None)


@pytest.mark.parametrize("spec", ["int8", "int4", "int8:block=64"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantizers_ratio_is_what_their_encoder_sends(spec, dtype):
    """Codes and the per-block scales: the model's ratio against a real encode (a message of
    1 M values, so the header is negligible)."""
    from neoxlab.compress import make_compressor, parse_spec
    from neoxlab.perfmodel.predict import codec_ratio

    x = torch.randn(1 << 20).to(dtype)
    sent = make_compressor(spec).encode(x).numel()
    name, params = parse_spec(spec)
    bits = torch.finfo(dtype).bits
    assert codec_ratio(name, params, bits, None) == pytest.approx(x.numel() * bits / 8 / sent,
                                                                   rel=1e-4)


def test_a_codec_profile_timed_at_the_dimension_rate_is_preferred():
    # zhybrid codes ZeRO and TP traffic at ZFP rate 24, naive everything at rate 8: a slow
    # rate-24 profile slows zhybrid's codecs only
    def codec_s(scheme: str, profile: PerfProfile) -> float:
        cfg = compose_experiment("local_3d", [f"compression={scheme}"])
        return predict(cfg, profile).breakdown["codec"] / predict(cfg, profile).slowdown

    base = resolve_profile(compose_experiment("local_3d")).profile
    slow = dataclasses.replace(base, codecs={**base.codecs, "zfp:rate=24": CodecProfile(
        encode_gbs=base.codecs["zfp"].encode_gbs / 10,
        decode_gbs=base.codecs["zfp"].decode_gbs / 10, call_us=base.codecs["zfp"].call_us)})
    assert codec_s("zhybrid", slow) > 2 * codec_s("zhybrid", base)
    assert codec_s("naive", slow) == pytest.approx(codec_s("naive", base))


def test_links_follow_the_rank_layout():
    lassen = resolve_layout(compose_experiment("baseline_192gpu"))
    assert not crosses_nodes(lassen, "tp", 4)  # TP 4 = one node
    assert crosses_nodes(lassen, "pp", 4) and crosses_nodes(lassen, "dp", 4)
    local = resolve_layout(compose_experiment("local_3d"))
    assert not any(crosses_nodes(local, d, 8) for d in ("tp", "pp", "dp"))


def test_prediction_adds_up_and_uses_the_metrics_definition():
    cfg = compose_experiment("hybrid_192gpu", ["task=predict"])
    pred = predict(cfg)
    assert set(pred.breakdown) == set(COMPONENTS)
    assert sum(pred.breakdown.values()) == pytest.approx(pred.step_s)
    layout = resolve_layout(cfg)
    flops = metrics.flops_per_iteration(cfg.model, 1536, 50432, True)
    assert pred.tflops_per_gpu == pytest.approx(flops / (pred.step_s * 192) / 1e12)
    assert pred.samples_per_s == pytest.approx(layout.global_batch / pred.step_s)
    assert pred.links == {"tp": "intra", "pp": "inter", "dp": "inter", "zero": "inter",
                          "control": "inter"}


def test_ranks_sharing_cores_run_at_their_share():
    # 8 ranks on 2 cores, data parallel (every rank busy all step): each gets 2/8 of a
    # core, 2/12 with 4 threads of other jobs
    cfg = compose_experiment("local_3d", ["parallel.tp=1", "parallel.pp=1"])
    profile = resolve_profile(cfg).profile
    idle, busy = predict(cfg, profile), predict(cfg, profile, external=4.0)
    assert busy.step_s == pytest.approx(idle.step_s * 12 / 8)
    assert idle.slowdown == pytest.approx(8 / 2)
    # 4 stages x 8 micro-batches on 4 ranks: 4 x 8 / 11 ranks busy on average, so the
    # critical path runs at 2 / 2.9 of full speed, but the cores cap the CPU work at half
    pipe = compose_experiment("local_3d", ["parallel.tp=1", "parallel.pp=4",
                                           "parallel.grad_accum=8", "cluster.ranks_per_node=4"])
    pred = predict(pipe, profile)
    assert pred.step_s == max(pred.critical_s, pred.throughput_s)
    lassen = compose_experiment("baseline_192gpu")  # a GPU per rank: nothing shared
    assert predict(lassen, external=3.0).step_s == predict(lassen).step_s


def test_a_pipelines_p2p_is_on_the_path_only_while_it_fills_and_drains():
    # Lassen (pp 4, a GPU a rank): each boundary's activation and gradient cross the path
    # once, however many micro-batches; a link so slow that a message outlasts a slot adds
    # its excess every micro-batch
    cfg = compose_experiment("baseline_192gpu")
    profile = resolve_profile(cfg).profile
    layout = resolve_layout(cfg)
    (msg,) = [m for m in traffic.messages(cfg, layout) if m.dim == "pp"]
    pp_mb = costs.message_cost(msg, profile.inter, None).comm_s * msg.count
    four = predict(cfg, profile)
    more = compose_experiment("baseline_192gpu", ["parallel.grad_accum=64"])
    eight = predict(more, profile)
    assert four.breakdown["pp"] == pytest.approx((layout.pp - 1) * pp_mb)
    assert eight.breakdown["pp"] == pytest.approx(four.breakdown["pp"])
    assert eight.breakdown["compute"] == pytest.approx(2 * four.breakdown["compute"])
    slow = dataclasses.replace(profile, inter=dataclasses.replace(
        profile.inter, bandwidth_gbs=profile.inter.bandwidth_gbs / 1e4))
    crawl = predict(cfg, slow)
    (slow_msg,) = [m for m in traffic.messages(cfg, layout) if m.dim == "pp"]
    slow_mb = costs.message_cost(slow_msg, slow.inter, None).comm_s * slow_msg.count
    assert crawl.breakdown["pp"] > (layout.pp - 1) * slow_mb + layout.grad_accum * 0.4 * slow_mb


def test_pipeline_ranks_waiting_on_a_shaped_uplink_lend_their_cores():
    """4 ranks on 2 cores, 2 stages x 2 micro-batches: busy 4 x 2/3 while they compute
    (old rule); waiting on a wire that frees the cores, fewer; on a veth, as many."""
    cfg = compose_experiment("local_3d", ["parallel.tp=1", "parallel.pp=2", "parallel.dp=2",
                                          "parallel.grad_accum=2", "cluster.ranks_per_node=4"])
    layout, profile = resolve_layout(cfg), resolve_profile(cfg).profile
    share = 4 * 2 / 3
    busy, _ = slowdowns(cfg, layout, profile, None, cpu_s=0.1, wire_s=0.1, free_s=0.0)
    assert busy == pytest.approx(share / 2)
    lent, _ = slowdowns(cfg, layout, profile, None, cpu_s=0.5, wire_s=0.1, free_s=0.1)
    assert 1.0 < lent < share / 2
    u = 2 / 3 * (0.5 * lent) / (0.5 * lent + 0.1)  # the rule it solves: s = ranks u / cores
    assert lent == pytest.approx(4 * u / 2)
    assert slowdowns(cfg, layout, profile, None, 0.1, 0.1, 0.1)[0] == 1.0  # never below
    loaded, _ = slowdowns(cfg, layout, profile, 2.0, cpu_s=0.1, wire_s=0.1, free_s=0.05)
    u = 2 / 3 * (0.1 * loaded + 0.05) / (0.1 * loaded + 0.1)
    assert loaded == pytest.approx((4 * u + 2.0) / 2)
    lockstep = compose_experiment("local_3d", ["parallel.tp=1", "parallel.pp=1",
                                               "cluster.ranks_per_node=4"])
    assert slowdowns(lockstep, resolve_layout(lockstep), profile, None, 0.1, 0.1, 0.1)[0] == \
        pytest.approx(4 / 2)


def test_a_latency_leaves_the_cores_free_and_a_veths_bytes_do_not():
    """A pipeline on shared cores whose TP crosses a veth (its packets take the cores): the
    same TP seconds slow the stages' compute less when they are latencies (waiting for the
    peer) than when they are bytes."""
    cfg = compose_experiment("local_3d", ["parallel.tp=2", "parallel.pp=2", "parallel.dp=1",
                                          "parallel.grad_accum=2", "cluster.nodes=2",
                                          "cluster.ranks_per_node=2", "cluster.cores_per_node=1"])
    layout, base = resolve_layout(cfg), resolve_profile(cfg).profile
    assert predict(cfg).links["tp"] == "intra" and predict(cfg).links["pp"] == "inter"
    veth = dataclasses.replace(base.intra, fitted_under_load=True, busy_fraction=1.0,
                               latency_us=0.0, bandwidth_gbs=1e-2)
    bytes_only = dataclasses.replace(base, intra=veth)
    tp = [m for m in traffic.messages(cfg, layout) if m.dim == "tp"]
    seconds = sum(costs.message_cost(m, veth, None).comm_s * m.count for m in tp)
    steps = sum(2 * (m.group - 1) * m.count if m.op == "all_reduce" else (m.group - 1) * m.count
                for m in tp)
    waits = dataclasses.replace(veth, latency_us=seconds / steps * 1e6, bandwidth_gbs=math.inf)
    latency_only = dataclasses.replace(base, intra=waits)
    assert sum(costs.message_cost(m, waits, None).comm_s * m.count for m in tp) == \
        pytest.approx(seconds)
    busy, waiting = predict(cfg, bytes_only), predict(cfg, latency_only)
    assert waiting.critical_s < busy.critical_s
    link = latencies_only(base.inter)
    (p2p,) = [m for m in traffic.messages(cfg, layout) if m.dim == "pp"]
    assert costs.message_cost(p2p, link, None).comm_s == pytest.approx(
        (base.inter.p2p_latency_us or base.inter.latency_us) * 1e-6)


def test_faster_links_shrink_only_the_communication():
    cfg = compose_experiment("baseline_192gpu")
    base = resolve_profile(cfg).profile
    fast = dataclasses.replace(base, inter=dataclasses.replace(base.inter, bandwidth_gbs=1e6))
    slow, quick = predict(cfg, base), predict(cfg, fast)
    assert quick.breakdown["compute"] == slow.breakdown["compute"]
    assert quick.breakdown["dp"] < slow.breakdown["dp"] / 100


def test_cluster_without_profile_is_a_clear_error():
    cfg = compose_experiment("local_slurm", ["task=predict"])
    cfg.cluster.profile = None
    with pytest.raises(ConfigError) as info:
        predict(cfg)
    message = str(info.value)
    assert "no hardware profile" in message and "configs/cluster/" in message


def test_predict_refuses_a_layout_that_does_not_validate(results_dir):
    cmd = [sys.executable, "-m", "neoxlab", "experiment=hybrid_192gpu", "task=predict",
           "parallel.tp=3", f"launch.results_dir={results_dir}"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "parallel.tp=3" in proc.stderr and "nothing started" in proc.stderr
    assert not any(results_dir.rglob("prediction.json"))


def test_predict_task_writes_prediction_and_launches_nothing(results_dir):
    cmd = [sys.executable, "-m", "neoxlab", "experiment=hybrid_192gpu", "task=predict",
           f"launch.results_dir={results_dir}"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (found,) = results_dir.glob("predictions/hybrid_192gpu/*/prediction.json")
    data = json.loads(found.read_text())
    assert data["gpus"] == 192 and data["step_s"] > 0
    assert json.loads((found.parent / "status.json").read_text())["state"] == "predicted"
    assert not list(found.parent.glob("job.*")), "predict must not render or submit a job"
    assert re.search(r"hybrid_192gpu\s+192\s+4\s+4\s+12", proc.stdout)


def test_alpha_beta_fit_recovers_known_parameters():
    alpha, bw, sizes = 50e-6, 3e9, (1024, 65536, 1 << 20)

    def rows(steps, share, stretch):  # times as measured under a stretch
        return [{"size": s, "avg_us": (steps * alpha + share * s / bw) * stretch * 1e6}
                for s in sizes]

    sweeps = [("allreduce", 4, rows(6, 1.5, 2.0), 2.0), ("allreduce", 2, rows(2, 1.0, 1.0), 1.0),
              ("latency", 2, rows(1, 1.0, 3.0), 3.0),
              ("allgather", 4, rows(3, 3.0, 1.0), 1.0)]  # 3 peers' blocks of size s
    sweeps[2] = ("latency", 2, [{"size": s, "avg_us": (5e-6 + s / bw) * 3.0 * 1e6}
                                for s in sizes], 3.0)  # p2p: a cheaper latency of its own
    fit = fit_alpha_beta(sweeps)
    assert fit.latency_us == pytest.approx(50.0)
    assert fit.bandwidth_gbs == pytest.approx(3.0)
    assert fit.p2p_latency_us == pytest.approx(5.0)


def test_compute_fit_recovers_known_rate_and_overheads():
    truth = PerfProfile(achievable_tflops=0.02, intra=LINK, inter=LINK, layer_overhead_us=3000,
                        step_overhead_us=20000, shared_cores=True)
    start = dataclasses.replace(truth, achievable_tflops=1.0, layer_overhead_us=0,
                                step_overhead_us=0)
    layouts = [["model=neox_small", "parallel.tp=1", "parallel.pp=1", "parallel.grad_accum=1"],
               ["parallel.tp=1", "parallel.pp=4", "parallel.grad_accum=8"],
               ["parallel.tp=1", "parallel.pp=1", "parallel.grad_accum=1"]]
    runs = []
    for overrides, external in zip(layouts, (1.0, 4.0, None), strict=True):
        cfg = compose_experiment("local_3d", [*overrides, "cluster.ranks_per_node=4"])
        runs.append((cfg, predict(cfg, truth, external=external).step_s, external))
    fitted = fit_compute(runs, start)
    assert fitted.achievable_tflops == pytest.approx(0.02, rel=1e-6)
    assert fitted.layer_overhead_us == pytest.approx(3000, rel=1e-6)
    assert fitted.step_overhead_us == pytest.approx(20000, rel=1e-6)


@pytest.mark.parametrize("cluster", ["lassen", "slurm", "local", "slurm_local"])
def test_every_profile_value_names_its_source(cluster):
    """A value line in a profile block carries a comment, or the line above is a comment or a
    commented block header."""
    lines = (REPO_ROOT / "configs" / "cluster" / f"{cluster}.yaml").read_text().splitlines()
    start = lines.index("profile:")
    missing = []
    provenance = None  # the indent of the provenance block's entries: sources themselves
    for i, line in enumerate(lines[start + 1:], start + 1):
        key, _, value = line.strip().partition(":")
        indent = len(line) - len(line.lstrip())
        if provenance is not None and indent < provenance:
            provenance = None
        if key == "provenance":
            provenance = indent + 1
        if (not line.startswith(" ") or not value.strip() or value.strip().startswith("#")
                or key == "source" or provenance is not None):  # descriptions and sources
            continue
        above = lines[i - 1].strip()
        header = above.partition("#")[0].strip().endswith(":")
        if "#" not in line and not above.startswith("#") and not (header and "#" in above):
            missing.append(line)
    assert not missing, f"profile values without a source comment: {missing}"


def _sampled(tasks: int, busy: list[bool], run_ns: int, wait_ns: int):
    """A Sampler holding `tasks` tasks sampled every 0.1 s: in a busy interval each runs
    `run_ns` and waits `wait_ns` for a core, in the others it sleeps."""
    from neoxlab.perfmodel.stretch import Sampler

    sampler = Sampler("none")
    for pid in range(tasks):
        run = wait = 0
        sampler.samples[pid].append((0.0, 0, 0, 0))
        for i, b in enumerate(busy, 1):
            run, wait = run + b * run_ns, wait + b * wait_ns
            sampler.samples[pid].append((i / 10, run, wait, run))
    return sampler


def test_external_load_counts_only_while_our_ranks_run():
    # 4 ranks on 2 cores in bursts (runnable through 1 interval in 10, on a core half of
    # it: stretch 2, just each other), asleep on a link the rest: no other job
    bursty = _sampled(4, [True] + [False] * 9, 50_000_000, 50_000_000)
    assert bursty.load().external(2) > 3  # the whole window's totals see phantom threads
    assert bursty.external_while_running(2) == pytest.approx(0.0, abs=1e-9)
    # always runnable and on a core a third of the time: 2 x 3 = 6 threads compete, 4 are
    # ours, 2 belong to other jobs, whichever way it is counted
    steady = _sampled(4, [True] * 10, 100_000_000 // 3, 200_000_000 // 3)
    assert steady.external_while_running(2) == pytest.approx(2.0, rel=1e-6)
    assert steady.load().external(2) == pytest.approx(2.0, rel=1e-6)


def test_external_load_leaves_out_our_own_helper_threads():
    # 2 cores, stretch 3: 6 threads compete; 2 are our runnable ranks, our helper threads use
    # half a core (worth 1.5 always-runnable threads), so 2.5 belong to other jobs
    assert Load(stretch=3.0, runnable=2.0, helpers=0.5).external(2) == pytest.approx(2.5)
    assert Load(stretch=1.0, runnable=2.0, helpers=0.5).external(2) == 0.0


# The sampler against a spinning helper thread is timing-dependent: studies/perfmodel_validation.py
