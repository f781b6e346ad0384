"""task=tune's logic on small fixtures: the candidates, the margin, the guard's verdicts, the
probes' orchestration with canned runs, the in-situ profile's cache and the chosen config."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from neoxlab.comm.capture import Capture, load
from neoxlab.comm.compression_rules import validate_compression
from neoxlab.commands.cli import main
from neoxlab.compress import make_compressor
from neoxlab.config import CompressionConfig, ConfigError
from neoxlab.config.compose import compose_experiment
from neoxlab.config.profile import CodecProfile, LinkProfile
from neoxlab.layout import resolve_layout
from neoxlab.perfmodel import emulated as em
from neoxlab.perfmodel.predict import dim_seconds
from neoxlab.perfmodel.resolve import resolve_profile
from neoxlab.tune import guard, insitu, proxy
from neoxlab.tune import task as tune_task
from neoxlab.tune.candidates import (
    Candidate,
    Scheme,
    apply,
    enumerate_candidates,
    overrides,
    scheme_errors,
    tune_codecs,
)
from neoxlab.tune.choose import Scored, combine, eligible, score_candidates
from neoxlab.tune.probe import Run
from neoxlab.tune.ranked import export_ranked, neighbours, spread
from neoxlab.tune.report import Outcome, write_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def local(*extra: str):
    """tune_local's layout (TP=2 x DP=2, ZeRO-1, fp32) with overrides."""
    return compose_experiment("tune_local", list(extra))


# ---- candidates --------------------------------------------------------------------------

def test_every_codec_on_every_dimension_with_traffic_and_never_control():
    cfg = local()
    cands, excluded = enumerate_candidates(cfg, resolve_layout(cfg))
    by_dim = {d: {c.codec for c in cands if c.dim == d} for d in ("tp", "pp", "dp", "zero")}
    assert by_dim["tp"] == by_dim["dp"] == by_dim["zero"] == set(tune_codecs(cfg))
    assert by_dim["pp"] == set()  # pp=1: nothing to compress, and the report says why
    reasons = {e.dim: e.reason for e in excluded}
    assert "pp=1" in reasons["pp"] and "never compressed" in reasons["other"]
    assert not any(c.dim == "other" for c in cands)


def test_options_belong_to_their_dimensions():
    cfg = local()
    cands, _ = enumerate_candidates(cfg, resolve_layout(cfg))
    assert all(not c.error_feedback for c in cands if c.dim != "dp")
    assert all(not make_compressor(c.codec).lossless for c in cands if c.error_feedback)
    assert {c.reduce_to_owner for c in cands if c.dim == "dp"} == {False, True}
    assert all(c.reduce_to_owner is None for c in cands if c.dim != "dp")
    assert {c.allreduce for c in cands if c.dim == "tp" and c.compressed} == {
        "auto", "alltoall", "allgather"}
    # a reduce to owners runs no all-reduce; zero and uncompressed dims pick no algorithm
    assert all(c.allreduce is None for c in cands
               if c.reduce_to_owner or c.dim == "zero" or not c.compressed)


def test_half_precision_leaves_out_codecs_that_cannot_shrink_it():
    cfg = local("train.precision=bf16")
    cands, excluded = enumerate_candidates(cfg, resolve_layout(cfg))
    tp = {c.codec for c in cands if c.dim == "tp"}
    assert {"zfp:rate=16", "zfp:rate=24", "fp16", "bf16"}.isdisjoint(tp)
    assert "zfp:rate=12" in tp and "int4" in tp
    assert any(e.dim == "tp" and e.codec == "bf16" and "cannot shrink" in e.reason
               for e in excluded)


def test_no_reduce_to_owner_without_zero():
    cfg = local("zero=stage0")
    cands, excluded = enumerate_candidates(cfg, resolve_layout(cfg))
    assert not any(c.reduce_to_owner for c in cands)
    assert not any(c.dim == "zero" for c in cands)
    assert any(e.dim == "zero" for e in excluded)


def test_a_scheme_runs_as_its_overrides_compose_it():
    cfg = local()
    scheme = Scheme("t", {
        "dp": Candidate("dp", "zfp:rate=8", allreduce="alltoall", reduce_to_owner=False,
                        error_feedback=True),
        "tp": Candidate("tp", "int8", allreduce="alltoall")})
    composed = local(*overrides(cfg, scheme))
    assert composed.compression == apply(cfg, scheme).compression
    assert validate_compression(composed, trains=True) == []
    owner = Scheme("o", {"dp": Candidate("dp", "int8", reduce_to_owner=True)})
    assert local(*overrides(cfg, owner)).zero.reduce_to_owner is True


def test_dimensions_that_disagree_on_the_allreduce_algorithm_are_refused():
    cfg = local()
    scheme = Scheme("t", {"dp": Candidate("dp", "int8", allreduce="allgather",
                                          reduce_to_owner=False),
                          "tp": Candidate("tp", "int8", allreduce="alltoall")})
    assert not scheme.consistent()
    assert any("compression.allreduce" in e for e in scheme_errors(cfg, scheme))


# ---- the margin --------------------------------------------------------------------------

def test_the_margin_is_a_share_of_the_terms_a_choice_trades():
    s = Scored(Scheme("x"), prediction=object(), saving_s=1.0, traded_s=10.0, margin=0.05)
    assert s.clears_margin and s.threshold_s == pytest.approx(0.5)
    assert not dataclasses.replace(s, margin=0.2).clears_margin  # 1.0 < 2.0
    assert not Scored(Scheme("y"), prediction=None, saving_s=5.0, margin=0.0).clears_margin


def slow_link_profile(cfg, gbs: float):
    """The local profile with every link at `gbs` GB/s, and the casts and quantizers at
    1 GB/s (the YAML profile times zfp and mpc only)."""
    p = resolve_profile(cfg).profile
    link = LinkProfile(latency_us=50.0, bandwidth_gbs=gbs)
    codec = CodecProfile(encode_gbs=1.0, decode_gbs=1.0, call_us=10.0)
    codecs = {**p.codecs, **{name: codec for name in ("fp16", "bf16", "int8", "int4")}}
    return dataclasses.replace(p, intra=link, inter=link, shared_cores=False, codecs=codecs)


def dp_only(*extra):
    return local("parallel.tp=1", "cluster.ranks_per_node=2", "tune.codecs=[none,'zfp:rate=8']",
                 *extra)


def test_a_slow_link_lets_compression_clear_the_margin_and_a_fast_one_does_not():
    cfg = dp_only()
    cands, _ = enumerate_candidates(cfg, resolve_layout(cfg))
    slow = slow_link_profile(cfg, 1e-4)  # 100 kB/s: the gradients' wire time dominates
    _, scored = score_candidates(cfg, cands, slow, "fixture")
    assert any(s.clears_margin for s in scored if s.candidate.codec == "zfp:rate=8")
    fast = slow_link_profile(cfg, 1e3)  # 1 TB/s: nothing to save, the codec still costs
    _, scored = score_candidates(cfg, cands, fast, "fixture")
    assert not any(s.clears_margin for s in scored if s.candidate.compressed)


def test_a_margin_near_one_keeps_every_dimension_uncompressed():
    cfg = dp_only("tune.margin=0.99")
    cands, _ = enumerate_candidates(cfg, resolve_layout(cfg))
    profile = slow_link_profile(cfg, 1e-4)
    base, scored = score_candidates(cfg, cands, profile, "fixture")
    # a saving must exceed 0.99 x (comm before + after + codec): more than it can be
    assert not any(s.clears_margin for s in scored)
    schemes = combine(cfg, scored, lambda c: True, profile, "fixture", base)
    assert [s.scheme.label for s in schemes] == ["none"]


def test_a_candidate_over_the_error_budget_is_left_out_of_the_schemes():
    cfg = dp_only()
    cands, _ = enumerate_candidates(cfg, resolve_layout(cfg))
    profile = slow_link_profile(cfg, 1e-4)
    base, scored = score_candidates(cfg, cands, profile, "fixture")
    errors = {("dp", "zfp:rate=8"): 0.5, ("zero", "zfp:rate=8"): 0.001}
    verdicts = {k: guard.proxy_verdict(e, 0.032, False) for k, e in errors.items()}
    passes = lambda c: not c.compressed or verdicts[(c.dim, c.codec)].ok  # noqa: E731
    assert not any(c.compressed for c in eligible(scored, passes, "dp", 2))
    schemes = combine(cfg, scored, passes, profile, "fixture", base)
    assert all("dp" not in s.scheme.parts or not s.scheme.parts["dp"].compressed
               for s in schemes)
    assert any("zero" in s.scheme.parts for s in schemes)


# ---- stage (a): capture and proxy --------------------------------------------------------

def test_capture_keeps_the_first_messages_a_codec_would_see(tmp_path):
    cap = Capture(limit=2, max_numel=100, min_bytes=64)
    cap.offer("dp", "all_reduce", torch.ones(1000))
    cap.offer("dp", "all_reduce", torch.full((1000,), 2.0))
    cap.offer("dp", "all_reduce", torch.full((1000,), 3.0))  # over the limit
    cap.offer("tp", "all_reduce", torch.ones(4))  # under min_bytes
    cap.offer("tp", "all_reduce", torch.ones(100, dtype=torch.int64))  # not a float
    cap.offer("tp", "recv", torch.ones(1000))  # a receive buffer holds no message yet
    cap.save(tmp_path, 0)
    got = load(tmp_path)
    assert set(got) == {"dp"}
    assert [t.numel() for t in got["dp"]] == [100, 100]
    assert [float(t[0]) for t in got["dp"]] == [1.0, 2.0]


def test_the_proxy_orders_codecs_by_the_error_they_cause():
    x = proxy.synthetic(torch.float32)
    err = {s: proxy.relative_error(s, x) for s in ("none", "fp16", "int8", "int4",
                                                   "zfp:rate=4", "zfp:rate=8", "mpc")}
    assert err["none"] == 0.0 and err["mpc"] == 0.0
    assert 0 < err["fp16"] < err["int8"] < err["int4"]
    assert err["zfp:rate=8"] < err["zfp:rate=4"]
    assert proxy.relative_error("int8", []) is None


@pytest.mark.parametrize("error,lossless,ok", [
    (0.1, False, False), (0.01, False, True), (None, False, False), (None, True, True),
    (math.nan, False, False)])
def test_proxy_verdicts(error, lossless, ok):
    assert guard.proxy_verdict(error, 0.032, lossless).ok is ok


# ---- stage (b) and silent failures -------------------------------------------------------

def records(losses, norms=None):
    norms = norms or [1.0] * len(losses)
    return [{"step": i + 1, "loss": v, "grad_norm": n, "iteration_s": 0.1}
            for i, (v, n) in enumerate(zip(losses, norms, strict=True))]


def test_sanity_catches_constant_loss_zero_grad_norm_and_nan():
    assert guard.sanity(records([5.0, 4.9, 4.7])) == []
    assert "constant loss" in guard.sanity(records([5.0, 5.0, 5.0]))[0]
    assert "zero gradient norm" in guard.sanity(records([5.0, 4.9], [0.0, 0.0]))[0]
    assert "not finite" in guard.sanity(records([5.0, math.nan]))[0]
    assert guard.sanity([]) == ["no step logged"]


def test_the_probe_threshold_is_learnt_from_seed_noise():
    steps = [5, 6, 7, 8]
    base = {s: 5.0 - 0.1 * s for s in range(1, 9)}
    other_seed = {s: v + 0.2 for s, v in base.items()}
    threshold = guard.noise_threshold(base, [other_seed], steps, factor=0.5)
    assert threshold == pytest.approx(0.1)
    close = {s: v + 0.02 for s, v in base.items()}
    far = {s: v + 0.3 for s, v in base.items()}
    assert guard.probe_verdict(close, base, steps, threshold)[0].ok
    verdict, dev = guard.probe_verdict(far, base, steps, threshold)
    assert not verdict.ok and dev == pytest.approx(0.3)
    assert not guard.probe_verdict(close, base, steps, math.nan)[0].ok


def test_bytes_on_the_wire_must_match_what_the_scheme_meant():
    ok = {"calls": 4, "compressed_calls": 4, "bytes_in": 1000, "bytes_out": 300}
    raw = {"calls": 4, "compressed_calls": 0, "bytes_in": 1000, "bytes_out": 1000}
    assert guard.wire_problems({"dp": ok, "tp": raw}, {"dp": True, "tp": False}) == []
    assert "none of its 4 calls" in guard.wire_problems({"dp": raw}, {"dp": True})[0]
    full = dict(ok, bytes_out=1000)
    assert "saved nothing" in guard.wire_problems({"dp": full}, {"dp": True})[0]
    assert "meant to be raw" in guard.wire_problems({"tp": ok}, {"tp": False})[0]
    assert guard.uplink_problems(1000, 1040) == []
    assert guard.uplink_problems(1000, 2000)


class CannedRunner:
    """Runner stand-in: noise runs and probes (in the order started) from canned metrics and
    comm totals."""

    def __init__(self, root: Path, noise: tuple, probes: list[tuple]):
        self.root, self.noise, self.probes, self.started = root, noise, list(probes), []

    def _run(self, name: str, canned: tuple) -> Run:
        self.started.append(name)
        losses, norms, comm = canned
        run_dir = self.root / name
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({"comm": comm}))
        return Run(name, run_dir, wall_s=1.0, records=records(losses, norms))

    def train(self, name, extra):
        raise AssertionError(f"stage (b) started {name} from scratch: every run of it starts "
                             "from the shared checkpoint")

    def from_checkpoint(self, name, checkpoint, extra):
        assert checkpoint.name == "step2", checkpoint  # tune.warmup_steps=2
        if name.startswith("noise"):
            assert "compression.dims.dp.compressor=none" in extra and any(
                a.startswith("data.seed=") for a in extra), extra
            return self._run(name, self.noise)
        return self._run(name, self.probes.pop(0))


LOSSES = [5.0, 4.8, 4.6, 4.5, 4.4, 4.3]
SHRUNK = {"calls": 2, "compressed_calls": 2, "bytes_in": 1000, "bytes_out": 500}
RAW = {"calls": 2, "compressed_calls": 0, "bytes_in": 1000, "bytes_out": 1000}
NOISE = ([v + 0.2 for v in LOSSES], [1.0] * 6, {"dp": RAW, "zero": RAW})


def finalists_of(cfg, n: int):
    layout = resolve_layout(cfg)
    profile = slow_link_profile(cfg, 1e-4)
    cands, _ = enumerate_candidates(cfg, layout)
    base, scored = score_candidates(cfg, cands, profile, "fixture")
    found = [s for s in combine(cfg, scored, lambda c: True, profile, "fixture", base)
             if s.scheme.parts and s.clears_margin][:n]
    return layout, base, found


def comm_of(scheme: Scheme) -> dict:
    """What a scheme's probe sent: its compressed dimensions shrunk, the others raw."""
    return {d: SHRUNK if d in scheme.parts and scheme.parts[d].compressed else RAW
            for d in ("dp", "zero")}


def test_stage_b_rejects_a_silent_failure_and_takes_the_next_finalist(tmp_path):
    cfg = dp_only("tune.codecs=[none,int8,fp16]", "tune.warmup_steps=2", "tune.probe_steps=4",
                  "tune.finalists=3", "train.steps=1000000")
    layout, base, finalists = finalists_of(cfg, 2)
    assert len(finalists) == 2
    first, second = (s.scheme for s in finalists)
    runner = CannedRunner(tmp_path, NOISE, [
        ([4.5] * 6, [1.0] * 6, comm_of(first)),  # constant loss
        ([v + 0.01 for v in LOSSES], [1.0] * 6, comm_of(second))])
    baseline = Run("baseline", tmp_path, 10.0, records(LOSSES))
    verdicts, probes, notes, cost = {}, {}, [], {}
    chosen = tune_task._stage_b(cfg, layout, runner, baseline, base, finalists, verdicts,
                                probes, notes, cost)
    assert chosen is finalists[1]
    assert "constant loss" in verdicts[first.label].reason
    assert verdicts[second.label].ok and "within the noise" in verdicts[second.label].reason
    assert runner.started == ["noise_data1235", "probe1", "probe2"]


def test_stage_b_rejects_a_zero_grad_norm_probe_and_keeps_the_baseline(tmp_path):
    cfg = dp_only("tune.codecs=[none,int8]", "tune.warmup_steps=2", "tune.probe_steps=4",
                  "train.steps=1000000", "tune.finalists=1")
    layout, base, finalists = finalists_of(cfg, 1)
    runner = CannedRunner(tmp_path, NOISE, [(LOSSES, [0.0] * 6, comm_of(finalists[0].scheme))])
    baseline = Run("baseline", tmp_path, 10.0, records(LOSSES))
    verdicts = {}
    chosen = tune_task._stage_b(cfg, layout, runner, baseline, base, finalists, verdicts,
                                {}, [], {})
    assert chosen is base
    assert "zero gradient norm" in verdicts[finalists[0].scheme.label].reason


def test_a_probe_that_compressed_nothing_is_a_silent_failure(tmp_path):
    cfg = dp_only("tune.codecs=[none,int8]", "tune.warmup_steps=2", "tune.probe_steps=4",
                  "train.steps=1000000", "tune.finalists=1")
    layout, base, finalists = finalists_of(cfg, 1)
    runner = CannedRunner(tmp_path, NOISE, [(LOSSES, [1.0] * 6, {"dp": RAW, "zero": RAW})])
    baseline = Run("baseline", tmp_path, 10.0, records(LOSSES))
    verdicts = {}
    assert tune_task._stage_b(cfg, layout, runner, baseline, base, finalists, verdicts,
                              {}, [], {}) is base
    assert "meant to be compressed" in verdicts[finalists[0].scheme.label].reason


def test_a_probe_deviating_more_than_seed_noise_allows_is_rejected(tmp_path):
    cfg = dp_only("tune.codecs=[none,int8]", "tune.warmup_steps=2", "tune.probe_steps=4",
                  "train.steps=1000000", "tune.finalists=1")
    layout, base, finalists = finalists_of(cfg, 1)
    far = [v + 0.5 for v in LOSSES]  # noise 0.2 x factor 0.5 = 0.1 allowed
    runner = CannedRunner(tmp_path, NOISE, [(far, [1.0] * 6, comm_of(finalists[0].scheme))])
    baseline = Run("baseline", tmp_path, 10.0, records(LOSSES))
    verdicts, probes = {}, {}
    assert tune_task._stage_b(cfg, layout, runner, baseline, base, finalists, verdicts,
                              probes, [], {}) is base
    label = finalists[0].scheme.label
    assert "> threshold" in verdicts[label].reason
    assert probes[label] == (pytest.approx(0.5), pytest.approx(0.1))


def test_without_always_probe_nothing_over_the_cap_runs_and_the_line_says_so(tmp_path,
                                                                           capsys):
    cfg = dp_only("tune.codecs=[none,int8]", "tune.warmup_steps=2", "tune.probe_steps=4",
                  "train.steps=10", "tune.always_probe=false")  # 10 steps pay for no probe
    layout, base, finalists = finalists_of(cfg, 1)
    runner = CannedRunner(tmp_path, NOISE, [])
    baseline = Run("baseline", tmp_path, 10.0, records(LOSSES))
    verdicts, notes = {}, []
    chosen = tune_task._stage_b(cfg, layout, runner, baseline, base, finalists, verdicts,
                                {}, notes, {})
    assert runner.started == []
    assert chosen is finalists[0] and "stage (a) only" in verdicts[chosen.scheme.label].reason
    assert "stage (b) not run: noise run 1" in notes[0] and "over the probe cap" in notes[0]
    assert "[neoxlab] tune: stage (b) not run" in capsys.readouterr().out


def test_by_default_stage_b_runs_over_the_cap_and_says_so(tmp_path, capsys):
    """The lead's complaint: a default tune skipped stage (b) for its cap without a word."""
    cfg = dp_only("tune.codecs=[none,int8,fp16]", "tune.warmup_steps=2", "tune.probe_steps=4",
                  "tune.finalists=2", "train.steps=10")
    layout, base, finalists = finalists_of(cfg, 2)
    first = finalists[0].scheme
    runner = CannedRunner(tmp_path, NOISE, [(LOSSES, [1.0] * 6, comm_of(first))])
    baseline = Run("baseline", tmp_path, 10.0, records(LOSSES))
    verdicts, notes = {}, []
    chosen = tune_task._stage_b(cfg, layout, runner, baseline, base, finalists, verdicts,
                                {}, notes, {})
    assert runner.started == ["noise_data1235", "probe1"]  # the second finalist: not run
    assert chosen is finalists[0] and "within the noise" in verdicts[first.label].reason
    out = capsys.readouterr().out
    assert out.count("over the probe cap") == 2 and "run anyway" in out
    assert "[neoxlab] tune: stage (b): probe 1 done" in out
    assert any("run anyway" in n for n in notes)


# ---- the profile -------------------------------------------------------------------------

def test_codecs_are_timed_once_and_cached_with_provenance(results_dir):
    cfg = local(f"launch.results_dir={results_dir}")
    first = insitu.resolve(cfg, measure=True, specs=["int8"])
    assert "int8" in first.profile.codecs and first.path.exists()
    assert first.provenance["codecs"]["int8"]["host"]
    again = insitu.resolve(cfg, measure=False, specs=["int8"])
    assert again.profile.codecs["int8"] == first.profile.codecs["int8"]


def test_predict_on_the_emulated_cluster_reads_the_in_situ_profile(results_dir, capsys):
    args = ["experiment=emulated_2x2", "task=predict", f"launch.results_dir={results_dir}"]
    assert main(args) == 2
    assert "calibrate --insitu" in capsys.readouterr().err
    cfg = compose_experiment("emulated_2x2", [f"launch.results_dir={results_dir}"])
    measured = dataclasses.replace(resolve_profile(local()).profile, calibration=None,
                                   source="fixture: an in-situ profile")
    path = insitu.cache_path(cfg)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"profile": dataclasses.asdict(measured),
                                "provenance": {"fixture": True}}))
    assert main(args) == 0
    (run_dir,) = (results_dir / "predictions" / "emulated_2x2").iterdir()
    assert "fixture: an in-situ profile" in json.loads(
        (run_dir / "prediction.json").read_text())["profile"]


def test_a_cached_emulated_profile_follows_a_new_local_calibration(results_dir):
    """The links stay as measured; compute comes from the local profile of now."""
    cfg = compose_experiment("emulated_2x2", [f"launch.results_dir={results_dir}",
                                              "cluster.emulated.inter.rate_mbit=200"])
    links = em.UplinkModel.from_fits({
        ("none", 1, 2): LinkProfile(latency_us=300.0, bandwidth_gbs=1.0),
        ("none", 2, 2): LinkProfile(latency_us=300.0, bandwidth_gbs=0.5),
        ("200", 1, 2): LinkProfile(latency_us=2000.0, bandwidth_gbs=0.0225),
        ("200", 2, 2): LinkProfile(latency_us=2000.0, bandwidth_gbs=0.0112)})
    now_base = em.local_profile(results_dir)[0]
    older = dataclasses.replace(now_base, layer_overhead_us=now_base.layer_overhead_us + 1e3)
    path = insitu.cache_path(cfg)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({
        "profile": dataclasses.asdict(em.emulated_profile(older, links, 200.0, 2)),
        "provenance": {"base_profile": "an older local profile", "links": links.as_dict()}}))
    found = insitu.resolve(cfg)
    assert found.profile.layer_overhead_us == now_base.layer_overhead_us
    assert found.profile.inter == links.uplink(200.0, 2, 2)
    assert json.loads(path.read_text())["provenance"]["base_profile"] != "an older local profile"


def cached_2x2(results_dir: Path, rate: str = "200"):
    """emulated_2x2 (TP inside a node) with a cached in-situ profile of made-up links."""
    cfg = compose_experiment("emulated_2x2", [f"launch.results_dir={results_dir}",
                                              f"cluster.emulated.inter.rate_mbit={rate}"])
    links = em.UplinkModel.from_fits({
        ("none", 1, 2): LinkProfile(latency_us=300.0, bandwidth_gbs=1.0),
        ("none", 2, 2): LinkProfile(latency_us=300.0, bandwidth_gbs=0.5),
        ("200", 1, 2): LinkProfile(latency_us=2000.0, bandwidth_gbs=0.0225),
        ("200", 2, 2): LinkProfile(latency_us=2000.0, bandwidth_gbs=0.0112)})
    base, origin = em.local_profile(results_dir)
    path = insitu.cache_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "profile": dataclasses.asdict(em.emulated_profile(base, links, float(rate), 2)),
        "provenance": {"base_profile": origin, "links": links.as_dict()}}))
    return cfg


def fake_run(run_dir: Path, steps: int, comm: list[dict]) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": i}) + "\n"
                                                   for i in range(1, steps + 1)))
    (run_dir / "comm.jsonl").write_text("".join(json.dumps(c) + "\n" for c in comm))
    return run_dir


def test_a_runs_seconds_in_a_dimension_are_per_step_and_averaged_over_ranks(tmp_path):
    run = fake_run(tmp_path / "run", 5, [
        {"rank": 0, "dim": "tp", "op": "all_reduce", "comm_s": 0.5},
        {"rank": 0, "dim": "tp", "op": "all_gather", "comm_s": 0.1},
        {"rank": 1, "dim": "tp", "op": "all_reduce", "comm_s": 0.4},
        {"rank": 0, "dim": "dp", "op": "all_reduce", "comm_s": 9.0}])
    assert insitu.measured_dim_seconds(run, ["tp"]) == pytest.approx((0.6 + 0.4) / 2 / 5)
    with pytest.raises(ConfigError, match="no pp collectives"):
        insitu.measured_dim_seconds(run, ["pp"])


def test_the_intra_check_scales_the_intra_link_to_what_the_run_measured(results_dir, tmp_path):
    """Once recorded, the profile predicts the uncompressed run's seconds inside a node, and
    the uplink stays as fitted; a layout without traffic inside a node needs no check."""
    cfg = cached_2x2(results_dir)
    layout = resolve_layout(cfg)
    assert insitu.intra_dims(cfg, layout) == ["tp"]
    before = insitu.resolve(cfg)
    assert insitu.needs_intra_check(cfg, layout, before)
    assert "not yet checked against a run" in before.origin
    none = apply(cfg, Scheme("none"))
    predicted = dim_seconds(none, layout, before.profile, "tp", "intra")[0]
    steps = 5
    run = fake_run(tmp_path / "intra_link", steps, [
        {"rank": r, "dim": "tp", "op": "all_reduce", "comm_s": 0.4 * predicted * steps}
        for r in range(4)])
    insitu.record_intra_check(cfg, layout, before, run)
    after = insitu.resolve(cfg)
    assert not insitu.needs_intra_check(cfg, layout, after)
    assert dim_seconds(none, layout, after.profile, "tp", "intra")[0] == pytest.approx(
        0.4 * predicted)
    assert after.profile.intra.latency_us == pytest.approx(0.4 * before.profile.intra.latency_us)
    assert after.profile.inter == before.profile.inter
    assert "intra-node link x0.40" in after.origin
    four = compose_experiment("emulated_2x2", ["cluster.nodes=4", "cluster.ranks_per_node=1",
                                               "parallel.tp=1"])
    assert insitu.intra_dims(four, resolve_layout(four)) == []


def test_tune_runs_the_intra_check_once_and_prices_with_it(results_dir, monkeypatch):
    """task=tune on an emulated layout with TP inside a node runs one short uncompressed run
    (its comm.jsonl stands in here) and predicts with the scaled link; a second tune reuses
    the recorded check."""
    cfg = cached_2x2(results_dir)
    layout = resolve_layout(cfg)
    cfg.tune.measure = False
    runs = []

    def train(self, name, extra):
        runs.append((name, extra))
        measured = 1e-3  # seconds per step in TP: far below what the fixture's link says
        run_dir = fake_run(self.root / name / "run", 5, [
            {"rank": r, "dim": "tp", "op": "all_reduce", "comm_s": measured * 5}
            for r in range(4)])
        return Run(name, run_dir, 1.0)

    monkeypatch.setattr(tune_task.Runner, "train", train)
    (results_dir / "tune1").mkdir()
    (results_dir / "tune2").mkdir()
    first = tune_task.tune(cfg, layout, results_dir / "tune1", [])
    assert [name for name, _ in runs] == ["intra_link"]
    assert f"train.steps={insitu.INTRA_CHECK_STEPS}" in runs[0][1]
    assert "compression.dims.tp.compressor=none" in runs[0][1]
    none = apply(cfg, Scheme("none"))
    assert dim_seconds(none, layout, first.profile, "tp", "intra")[0] == pytest.approx(1e-3)
    tune_task.tune(cfg, layout, results_dir / "tune2", [])
    assert len(runs) == 1


def test_fit_points_cover_the_placement_and_the_bare_link():
    cfg = compose_experiment("emulated_2x2", ["cluster.emulated.inter.rate_mbit=80"])
    assert insitu.fit_points(cfg) == [("none", 1, 2), ("80", 1, 2), ("none", 2, 2),
                                      ("80", 2, 2)]
    bare = compose_experiment("emulated_2x2", ["cluster.emulated.inter.rate_mbit=null"])
    assert ("200", 1, 2) in insitu.fit_points(bare)


def test_a_cluster_without_a_profile_is_refused_with_the_fix(results_dir):
    cfg = compose_experiment("emulated_2x2", [f"launch.results_dir={results_dir}"])
    with pytest.raises(ConfigError, match="no in-situ profile"):
        insitu.resolve(cfg)


# ---- the chosen config -------------------------------------------------------------------

def outcome_for(cfg, scheme: Scheme) -> Outcome:
    profile = slow_link_profile(cfg, 1e-4)
    base, _ = score_candidates(cfg, [], profile, "fixture")
    chosen = Scored(scheme, base.prediction, margin=0.0)
    return Outcome(cfg.experiment, base, [], [], {}, {}, "fixture", [chosen], {}, {}, chosen,
                   {"total": 1.0})


def load_scheme(path: Path, cfg):
    data = yaml.safe_load(path.read_text())
    body = data.get("compression", data)
    compression = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(CompressionConfig),
                                                      body))
    return data, dataclasses.replace(cfg, compression=compression)


def test_the_chosen_scheme_is_a_compression_config_that_validates(tmp_path):
    cfg = local(f"tune.config_dir={tmp_path}")
    scheme = Scheme("x", {"dp": Candidate("dp", "zfp:rate=8", allreduce="auto",
                                          reduce_to_owner=False, error_feedback=True)})
    path = write_config(cfg, outcome_for(cfg, scheme), tmp_path)
    assert path == tmp_path / "tuned_tune_local.yaml"
    data, applied = load_scheme(path, cfg)
    assert "zero" not in data and data["dims"]["dp"]["error_feedback"] is True
    assert validate_compression(applied, trains=True) == []
    assert applied.compression.dims["dp"].params == {"rate": 8}


def test_a_changed_reduce_to_owner_is_written_in_the_global_package(tmp_path):
    cfg = local(f"tune.config_dir={tmp_path}")
    scheme = Scheme("x", {"dp": Candidate("dp", "int8", reduce_to_owner=True)})
    path = write_config(cfg, outcome_for(cfg, scheme), tmp_path)
    assert path.read_text().startswith("# @package _global_\n")
    data, _ = load_scheme(path, cfg)
    assert data["zero"] == {"reduce_to_owner": True}


@pytest.mark.parametrize("owner", [False, True])
def test_the_chosen_config_runs_as_a_compression_option(tmp_path, monkeypatch, owner):
    """Written into (a copy of) configs/compression/, `compression=tuned_<exp>` composes the
    scheme, zero.reduce_to_owner included, and passes every rule."""
    import shutil

    from neoxlab.commands.check import check
    from neoxlab.config import compose

    configs = tmp_path / "configs"
    shutil.copytree(compose.CONFIG_DIR, configs)
    monkeypatch.setattr(compose, "CONFIG_DIR", configs)
    cfg = local(f"tune.config_dir={configs / 'compression'}")
    dp = Candidate("dp", "int8", reduce_to_owner=owner, allreduce=None if owner else "auto")
    scheme = Scheme("x", {"dp": dp, "tp": Candidate("tp", "zfp:rate=12", allreduce="auto")})
    write_config(cfg, outcome_for(cfg, scheme), tmp_path)
    ran = compose.compose_experiment("tune_local", ["task=train", "compression=tuned_tune_local"])
    check(ran)
    meant = apply(cfg, Scheme("tuned_tune_local", scheme.parts)).compression
    assert ran.compression.dims == {d: v for d, v in meant.dims.items()
                                    if v.compressor != "none"}
    assert (ran.compression.scheme, ran.compression.allreduce) == (meant.scheme, meant.allreduce)
    assert ran.zero.reduce_to_owner is owner


# ---- the ranking exported for regret runs ------------------------------------------------

def test_spread_picks_evenly_and_keeps_the_baseline_and_the_pick():
    assert spread(9, 3, set()) == [0, 4, 8]
    assert spread(9, 3, {5}) == [0, 5, 8]  # 5 replaces the nearest evenly spaced one, 4
    assert spread(9, 2, {3, 6}) == [3, 6]
    assert spread(3, 5, {1}) == [0, 1, 2]


def ranked_outcome(cfg, profile=None) -> tuple[Outcome, str, str]:
    """dp_only's candidates at 100 kB/s, every codec passing stage (a) but ZFP on DP, the
    fastest compressed scheme rejected by its probe and the next one chosen. Also the
    rejected and the chosen scheme's labels."""
    profile = profile or slow_link_profile(cfg, 1e-4)
    cands, _ = enumerate_candidates(cfg, resolve_layout(cfg))
    base, scored = score_candidates(cfg, cands, profile, "fixture")
    verdicts = {(c.dim, c.codec): guard.Verdict(not (c.dim == "dp" and c.codec == "zfp:rate=8"),
                                                "fixture") for c in cands}
    schemes = combine(cfg, scored, lambda c: verdicts[(c.dim, c.codec)].ok, profile,
                      "fixture", base)
    rejected, chosen = [s for s in schemes if s.scheme.parts][:2]
    probes = {rejected.scheme.label: (1.0, 0.5), chosen.scheme.label: (0.1, 0.5)}
    scheme_verdicts = {rejected.scheme.label: guard.Verdict(False, "fixture: deviates"),
                       chosen.scheme.label: guard.Verdict(True, "fixture: passes")}
    out = Outcome(cfg.experiment, base, scored, [], {}, verdicts, "fixture", schemes,
                  scheme_verdicts, probes, chosen, {"total": 1.0}, profile=profile)
    return out, rejected.scheme.label, chosen.scheme.label


def ranked_cfg(k: int, *extra: str):
    return local("parallel.tp=1", "cluster.ranks_per_node=2",
                 "tune.codecs=[none,'zfp:rate=8',int8,bf16]", f"tune.export_ranked={k}", *extra)


@pytest.mark.parametrize("k", [4, 100])
def test_the_ranked_export_spreads_guard_passing_schemes_fastest_first(tmp_path, k):
    cfg = ranked_cfg(k)
    out, rejected, chosen = ranked_outcome(cfg)
    rows = export_ranked(cfg, out, tmp_path)
    assert rows == json.loads((tmp_path / "ranked.json").read_text())
    files = sorted((tmp_path / "ranked").glob("*.yaml"))
    assert [f.stem for f in files] == [r["name"] for r in rows]
    steps = [r["predicted_step_s"] for r in rows]
    assert steps == sorted(steps)
    if k == 4:
        assert len(rows) == 4
    else:  # every option: more than 4, so the k=4 export had to leave some out
        assert 4 < len(rows) < k
    labels = [r["label"] for r in rows]
    assert len(set(labels)) == len(labels)
    assert [r["label"] for r in rows if r["baseline"]] == ["none"]
    assert [r["label"] for r in rows if r["chosen"]] == [chosen]
    assert rejected not in labels  # its probe failed
    assert not any("dp=zfp" in label for label in labels)  # its proxy failed
    assert all("uplink_payload_bytes_per_step" not in r for r in rows)  # not emulated
    for f in files:
        data, applied = load_scheme(f, cfg)
        assert data.get("compression", data)["scheme"] == f.stem
        assert applied.compression.scheme == f.stem
        global_package = f.read_text().startswith("# @package _global_\n")
        assert global_package == ("zero" in data)


def test_no_ranked_export_by_default(tmp_path):
    cfg = ranked_cfg(0)
    out, _, _ = ranked_outcome(cfg)
    assert export_ranked(cfg, out, tmp_path) == []
    assert not (tmp_path / "ranked.json").exists()


def test_ranked_schemes_on_the_emulated_cluster_carry_their_uplink_bytes(tmp_path):
    cfg = compose_experiment("emulated_2x2", ["parallel.tp=1", "tune.export_ranked=3",
                                              "tune.codecs=[none,int8]", "tune.dims=[dp]"])
    out, _, _ = ranked_outcome(cfg, slow_link_profile(local(), 1e-4))
    rows = export_ranked(cfg, out, tmp_path)
    uplink = {r["label"]: r["uplink_payload_bytes_per_step"] for r in rows}
    assert len(uplink) == 3
    # int8 on DP (uncompressed ZeRO all-gather and control stay) sends fewer bytes
    assert all(v < uplink["none"] for label, v in uplink.items() if label != "none")


def test_the_ranked_configs_run_as_compression_options(tmp_path, monkeypatch):
    """A copy of each ranked file in configs/compression/ composes as `compression=<stem>`
    and passes every rule."""
    import shutil

    from neoxlab.commands.check import check
    from neoxlab.config import compose

    configs = tmp_path / "configs"
    shutil.copytree(compose.CONFIG_DIR, configs)
    monkeypatch.setattr(compose, "CONFIG_DIR", configs)
    cfg = ranked_cfg(4)
    out, _, _ = ranked_outcome(cfg)
    for row in export_ranked(cfg, out, tmp_path / "run"):
        shutil.copy(tmp_path / "run" / "ranked" / f"{row['name']}.yaml", configs / "compression")
        ran = compose.compose_experiment("tune_local", [
            "task=train", "parallel.tp=1", "cluster.ranks_per_node=2",
            f"compression={row['name']}"])
        check(ran)
        assert ran.compression.scheme == row["name"]


def test_tune_json_has_the_predicted_uplink_bytes_on_the_emulated_cluster_only():
    emulated = compose_experiment("emulated_2x2", ["parallel.tp=1", "tune.codecs=[none,int8]",
                                                   "tune.dims=[dp]"])
    out, _, _ = ranked_outcome(emulated, slow_link_profile(local(), 1e-4))
    written = tune_task.summary(emulated, out, Path("x.yaml"), 0)
    # the pick compresses DP's gradients: fewer bytes leave the nodes than uncompressed
    assert 0 < written["chosen_uplink_payload_bytes_per_step"] < written[
        "baseline_uplink_payload_bytes_per_step"]
    plain = ranked_cfg(0)
    written = tune_task.summary(plain, ranked_outcome(plain)[0], Path("x.yaml"), 0)
    assert written["chosen_uplink_payload_bytes_per_step"] is None
    assert written["baseline_uplink_payload_bytes_per_step"] is None


def test_a_ranked_export_of_one_is_refused():
    assert any("tune.export_ranked=1" in e for e in tune_task.rules(ranked_cfg(1), 2))
    assert not any("export_ranked" in e for e in tune_task.rules(ranked_cfg(2), 2))


def built_ranking(cfg) -> tuple[Outcome, list[str]]:
    """A ranking set by hand (predicted steps in seconds, fastest first): a scheme its probe
    rejected (1.0), tp=int8 alone (1.5), the pick (2.0), dp=bf16 (2.5), zero=fp16 which
    failed stage (a) (3.0), tp=ZFP 12 (3.5), dp=ZFP 8 (4.0), zero=int8 (4.5), none (5.0).
    Also the labels of the pick and the three guard-passing options predicted next slower."""
    base, _ = score_candidates(cfg, [], slow_link_profile(cfg, 1e-4), "fixture")

    def at(step: float, *parts: Candidate) -> Scored:
        prediction = dataclasses.replace(base.prediction, step_s=step)
        return Scored(Scheme("x", {c.dim: c for c in parts}), prediction)

    def dp(codec: str) -> Candidate:
        return Candidate("dp", codec, allreduce="auto", reduce_to_owner=False)

    def tp(codec: str) -> Candidate:
        return Candidate("tp", codec, allreduce="auto")

    rejected = at(1.0, dp("int8"), tp("int8"))
    pick = at(2.0, dp("int8"), Candidate("zero", "bf16"))
    singles = [at(1.5, tp("int8")), at(2.5, dp("bf16")), at(3.0, Candidate("zero", "fp16")),
               at(3.5, tp("zfp:rate=12")), at(4.0, dp("zfp:rate=8")),
               at(4.5, Candidate("zero", "int8"))]
    verdicts = {(s.candidate.dim, s.candidate.codec): guard.Verdict(
        s.candidate.codec != "fp16", "fixture") for s in singles}
    out = Outcome(cfg.experiment, base, singles, [], {}, verdicts, "fixture", [rejected, pick],
                  {rejected.scheme.label: guard.Verdict(False, "fixture: deviates"),
                   pick.scheme.label: guard.Verdict(True, "fixture: passes")},
                  {rejected.scheme.label: (1.0, 0.5), pick.scheme.label: (0.1, 0.5)}, pick,
                  {"total": 1.0}, profile=slow_link_profile(cfg, 1e-4))
    wanted = [pick.scheme.label, singles[1].scheme.label, singles[3].scheme.label,
              singles[4].scheme.label]
    return out, wanted


def test_the_neighbour_export_is_the_pick_and_the_next_three_in_predicted_order(tmp_path):
    """Not the option predicted faster than the pick, not the one stage (a) failed, not the
    baseline: the pick and the three guard-passing options predicted right after it."""
    cfg = local("tune.export_neighbours=3")
    out, wanted = built_ranking(cfg)
    rows = export_ranked(cfg, out, tmp_path)
    assert [r["label"] for r in rows] == wanted
    assert [r["chosen"] for r in rows] == [True, False, False, False]
    assert [r["predicted_step_s"] for r in rows] == [2.0, 2.5, 3.5, 4.0]
    # positions in the whole guard-passing ranking: tp=int8 alone is 1st, the pick 2nd
    assert [r["position"] for r in rows] == [2, 3, 4, 5]
    assert rows == json.loads((tmp_path / "ranked.json").read_text())
    assert [f.stem for f in sorted((tmp_path / "ranked").glob("*.yaml"))] == [
        r["name"] for r in rows]
    # the spread export of as many options spans the same ranking instead
    spread_rows = export_ranked(local("tune.export_ranked=4"), out, tmp_path / "spread")
    assert [r["label"] for r in spread_rows] != wanted
    assert spread_rows[-1]["label"] == "none"  # the baseline, always in the spread export


def test_the_neighbour_export_stops_where_the_ranking_ends():
    assert neighbours(9, 2, 3) == [2, 3, 4, 5]
    assert neighbours(5, 3, 3) == [3, 4]
    assert neighbours(5, 4, 3) == [4]  # the pick predicted slowest: itself alone


def test_the_neighbour_export_is_validated_with_the_value_the_rule_and_the_fix():
    (error,) = [e for e in tune_task.rules(local("tune.export_neighbours=-1"), 2)
                if "export_neighbours" in e]
    assert "tune.export_neighbours=-1" in error and ">= 1" in error
    (error,) = [e for e in tune_task.rules(
        local("tune.export_neighbours=3", "tune.export_ranked=12"), 2) if "export_" in e]
    assert "tune.export_ranked=12 and tune.export_neighbours=3" in error
    assert "one export at a time" in error and "set one of them to 0" in error
    assert not any("export_" in e for e in tune_task.rules(local("tune.export_neighbours=3"), 2))


def test_every_fixed_scheme_is_predicted_even_where_its_codec_is_no_candidate(tmp_path):
    """The widened fixed set (int8, int4, fp16, bf16 everywhere) is timed and predicted
    whatever tune.codecs holds, so "best fixed" is the best of all of them."""
    cfg = local("tune.measure=false", "tune.codecs=[none,int8]", f"launch.results_dir={tmp_path}")
    layout = resolve_layout(cfg)
    out = tune_task.tune(cfg, layout, tmp_path, [])
    assert {"int8", "int4", "fp16", "bf16", "naive"} <= set(out.fixed)
    not_predicted = {n: p for n, p in out.fixed.items() if isinstance(p, str)}
    assert not not_predicted, not_predicted
