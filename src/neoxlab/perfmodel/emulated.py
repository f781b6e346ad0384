"""The performance model on an emulated cluster: the uplink's alpha-beta fitted from gloo
all-reduce and all-gather sweeps (up to 4 MiB) run inside the namespaces, the rest from the
local profile. The bandwidth of every fit is the rate the sweeps' messages of 1 MiB and up
sustain (fit_rate), as the training collectives move 1-20 MB a call.

An uplink shaped to R Mbit/s carries at most R/8 MB/s per direction; TCP/IP headers and the
token bucket take a share of it, and how large a share depends on how many TCP flows cross
it at once (one flow backs off and leaves the bucket idle; two fill each other's gaps) and
on how long the message is (its first MiB goes near R/8, before the bucket's queue
overflows). So
the link model is, per node and direction, with f flows through the uplink at once while n
nodes send,

    B(R, f, n) = softmin_p(efficiency[f, n] x R / 8, B_unshaped(f, n))
    softmin_p(x, c) = (x^-p + c^-p)^(-1/p)
    alpha(R) = the median alpha of the one-flow shaped fits (tbf adds queueing, not a delay)
    B_full(R) = softmin_p(TCP_PAYLOAD_SHARE x R / 8, B_unshaped(1, 2))

with B_full what transfers that keep the uplink full get (a gather to one rank; a compressed
reduce to owners' payloads, one at a time: perfmodel.costs), B_unshaped(f, n) what f groups
that ran the sweeps at once on n nodes (experiment emulated_omb with omb.groups = f,
one rank of each group per node) carried together through an uplink of the bare link, and
efficiency[f, n] the median over the shaped fit rates of what makes the formula give their
B_fit (the bandwidth of one of f groups, times f). Near the bare link's cap the token bucket
and the cores that process its packets bind together, not one after the other: 4 nodes got
0.80-0.86 of R/8 at 10 Mbit/s but 0.72 at 200, where R/8 x 0.80 is nearly what their bare
link carries. One sharpness p serves every link: the one (of 2-64, or infinity: the plain
minimum) that makes the efficiency of each (f, n) the same at every fit rate.

Everything is fitted with as many nodes sending at once as the layout has. The bare link is
bound by the cores that process its packets, not by a rate: with 2 nodes, 2 flows carried
1.3x what one did (37.5 against 28.3 MB/s, medians of 5 runs); with 4 nodes one flow each
got 0.74x (21.0 MB/s). A node's ranks reduce at once (one in each DP group), so with k
ranks per node each gets B(R, k, n) / k (the model's per-rank convention, as
configs/cluster/lassen.yaml's inter link). Inside a node the ranks talk over the same kind
of bare veths while the other nodes' ranks send too, so the intra-node link is the bare fit
with the layout's flows and nodes at once; that fit already ran with all the ranks on the
cores, so its time is not slowed again by their sharing. Compute and framework overheads
come from the local profile (this machine's cores: the same ones the emulated nodes run
on); the codecs are timed on one thread (studies/emulated_model.py --measure).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from neoxlab.config import Config, ConfigError
from neoxlab.config.compose import compose_experiment
from neoxlab.config.profile import CodecProfile, LinkProfile, PerfProfile
from neoxlab.files import REPO_ROOT
from neoxlab.layout import resolve_layout
from neoxlab.perfmodel.fit import BANDWIDTH_BENCHMARKS, fit_alpha_beta, steps_and_bytes
from neoxlab.perfmodel.predict import Prediction, predict_with
from neoxlab.perfmodel.resolve import resolve_profile
from neoxlab.run import rundir

UNSHAPED = "none"
# the payload share of a full TCP segment's frame: 1448 bytes (MSS with timestamps, MTU 1500)
# of 1514 on the wire. Transfers that keep a shaped uplink full go at this share of R/8: a
# compressed reduce to owners' 0.30 MB payloads, one at a time, took 0.957 of R/8 at 200, 80
# and 40 Mbit/s (4x1-owner's timelines), where the ring collectives' fits get 0.73-0.83
TCP_PAYLOAD_SHARE = 1448 / 1514


def read_omb(run_dir: Path) -> list[dict]:
    """The all-reduce and all-gather rows rank 0 wrote (omb.jsonl of an emulated_omb run).
    With concurrent groups a row's time is the slowest group's: flows need not share a
    token bucket fairly (one CI run had group 0 at 1.16x its lone time, where both groups
    together needed 2x), and the slowest group's time is when the link carried them all."""
    lines = (run_dir / "omb.jsonl").read_text().splitlines()
    rows = [r for r in map(json.loads, lines) if r["benchmark"] in BANDWIDTH_BENCHMARKS]
    return [r | {"avg_us": max(r["group_avg_us"])} if r.get("group_avg_us") else r
            for r in rows]


SUSTAINED_FROM = 1 << 20  # bytes: the sizes the sustained rate is fitted on


def find_omb_runs(root: Path) -> dict[FitKey, list[Path]]:
    """Completed emulated_omb run dirs by (rate, flows, nodes), oldest first. A run that failed
    (a rank killed, a cut link) leaves a partial omb.jsonl; fitting it would mislead."""
    found: dict[FitKey, list[Path]] = {}
    for run_dir in sorted(root.iterdir()) if root.exists() else []:
        if (run_dir / "omb.jsonl").exists() and completed(run_dir):
            c = rundir.load_config(run_dir)
            rate = c.cluster.emulated.inter.rate_mbit
            key = ("none" if rate is None else f"{rate:g}", c.omb.groups, c.cluster.nodes)
            found.setdefault(key, []).append(run_dir)
    return found


def completed(run_dir: Path) -> bool:
    status = run_dir / "status.json"
    return status.exists() and json.loads(status.read_text()).get("state") == \
        rundir.State.COMPLETED


def run_omb(point: FitKey, results: Path, timeout_s: float | None = None) -> None:
    """One emulated_omb run at a fit point (rate, flows, nodes) under `results`."""
    rate, flows, nodes = point
    cmd = [sys.executable, "-m", "neoxlab", "experiment=emulated_omb",
           f"cluster.emulated.inter.rate_mbit={'null' if rate == 'none' else rate}",
           f"cluster.nodes={nodes}", f"cluster.ranks_per_node={flows}", f"omb.groups={flows}",
           f"launch.results_dir={results}"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout_s)
    if proc.returncode:
        raise ConfigError(f"{' '.join(cmd)} failed ({proc.returncode}): "
                          f"{(proc.stderr or proc.stdout)[-1500:]}")


def fit_rate(rows: list[dict], nodes: int = 2) -> LinkProfile:
    """One rate's sweeps (groups of one rank per node): alpha from every size, every
    benchmark at once, and the bandwidth the messages of SUSTAINED_FROM and up sustain
    (sustained_gbs); with concurrent groups, what one group got."""
    if not any(r["benchmark"] in BANDWIDTH_BENCHMARKS for r in rows):
        raise ConfigError(f"an emulated_omb sweep has no {list(BANDWIDTH_BENCHMARKS)} rows to "
                          "fit (omb.jsonl of a run cut short?): remove that run dir, or run "
                          "the sweep again")
    fit = fit_alpha_beta([(b, nodes, [r for r in rows if r["benchmark"] == b], 1.0)
                          for b in BANDWIDTH_BENCHMARKS])
    return dataclasses.replace(fit, bandwidth_gbs=sustained_gbs(rows, nodes))


def sustained_gbs(rows: list[dict], nodes: int) -> float:
    """The bandwidth of the sweeps' messages from SUSTAINED_FROM up: the slope of their time
    over their bytes on the wire, by least squares with an intercept of each benchmark's own.
    A shaped uplink carries a message's first MiB near R/8 and the rest slower (the token
    bucket's 200-ms queue overflows and TCP backs off): one flow between 4 nodes at 40 Mbit/s
    got 0.97 of R/8 in 1-MiB all-reduces, 0.77 in 4-MiB and 0.74 in 16-MiB ones. So the
    intercept is a head start (negative), and the slope is what the training collectives'
    1-20 MB messages get (4x1's DP all-reduce at 40 Mbit/s: 0.80 of R/8). A fit over every
    size with alpha >= 0 put the bandwidth between the two: one flow on 2 nodes at 10 Mbit/s
    got 0.77-0.83 of R/8 by such a fit and 0.69-0.79 by this one (7 runs)."""
    benchmarks = sorted({r["benchmark"] for r in rows if r["benchmark"] in BANDWIDTH_BENCHMARKS})
    large = [r for r in rows if r["size"] >= SUSTAINED_FROM and r["benchmark"] in benchmarks]
    sizes = {b: len({r["size"] for r in large if r["benchmark"] == b}) for b in benchmarks}
    if not sizes or min(sizes.values()) < 2:
        raise ValueError(
            f"the omb sweeps have {sizes} message sizes of {SUSTAINED_FROM} bytes or more per "
            "benchmark; the sustained bandwidth needs 2 or more of each: sweep up to "
            "omb.max_size=4194304 (experiment emulated_omb's default) or larger")
    a = [[float(r["benchmark"] == b) for b in benchmarks]
         + [steps_and_bytes(r["benchmark"], nodes, r["size"])[1]] for r in large]
    seconds_per_byte = np.linalg.lstsq(np.array(a), np.array([r["avg_us"] * 1e-6 for r in large]),
                                       rcond=None)[0][-1]
    if seconds_per_byte <= 0:
        raise ValueError(f"the omb sweeps' time does not grow with the message size from "
                         f"{SUSTAINED_FROM} bytes up ({len(large)} rows): rerun them")
    return float(1.0 / seconds_per_byte / 1e9)


def median_fit(fits: list[LinkProfile]) -> LinkProfile:
    """One link from the fits of repeated omb runs of a point: their median alpha and median
    bandwidth (one run's fit of the bare link moves by +-15 %, a shaped one's by +-5 %)."""
    return LinkProfile(latency_us=statistics.median(f.latency_us for f in fits),
                       bandwidth_gbs=statistics.median(f.bandwidth_gbs for f in fits))


SHARPNESS = (2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0, 64.0, math.inf)  # p tried, soft to hard


def soft_min(x: float, cap: float, p: float) -> float:
    """(x^-p + cap^-p)^(-1/p): near x where x << cap, near cap where cap << x, below both
    where they are close; p = infinity is the plain minimum."""
    return min(x, cap) if math.isinf(p) else (x ** -p + cap ** -p) ** (-1 / p)


def efficiency(total_gbs: float, rate_mbit: float, cap_gbs: float, p: float) -> float:
    """The share of R/8 with which soft_min(share x R/8, cap) is the measured total
    (infinite where the total is not below the cap, which no share reaches)."""
    nominal = rate_mbit / 8e3
    if math.isinf(p):
        return total_gbs / nominal
    if total_gbs >= cap_gbs:
        return math.inf
    return (total_gbs ** -p - cap_gbs ** -p) ** (-1 / p) / nominal


def fit_sharpness(points: dict[tuple[int, int], list[tuple[float, float]]],
                  caps: dict[tuple[int, int], float]) -> float:
    """The p of SHARPNESS under which each link's efficiency varies least over its fit
    rates (the sum of squared deviations of log efficiency from each link's mean): the
    hardest p within 5 % of the least spread, so that a softer one must earn its place."""
    def spread(p: float) -> float:
        total = 0.0
        for key, pts in points.items():
            effs = [efficiency(t, r, caps[key], p) for r, t in pts]
            if any(math.isinf(e) for e in effs):  # a fit at or above the cap: not this p
                return math.inf
            logs = [math.log(e) for e in effs]
            mean = sum(logs) / len(logs)
            total += sum((x - mean) ** 2 for x in logs)
        return total
    spreads = {p: spread(p) for p in SHARPNESS}
    least = min(spreads.values())
    return max(p for p, v in spreads.items() if v <= least * 1.05)


# (rate in Mbit/s or "none", flows through each uplink at once, nodes sending at once)
FitKey = tuple[str, int, int]
FIT_KEY = re.compile(r"(\S+) Mbit/s, (\d+) flow\(s\), (\d+) nodes")  # as_dict's keys


@dataclass(frozen=True)
class UplinkModel:
    unshaped: LinkProfile  # the bare veth path, one flow between 2 nodes
    efficiency: dict[tuple[int, int], float]  # (flows, nodes) -> their bytes/s over R/8
    unshaped_total: dict[tuple[int, int], float]  # (flows, nodes) -> GB/s of an uplink, bare
    latency_us: float  # alpha of the one-flow shaped fits
    fits: dict[FitKey, LinkProfile]  # each fit of its own
    sharpness: float = math.inf  # p of the soft minimum of the shaped rate and the bare cap

    @classmethod
    def from_fits(cls, fits: dict[FitKey, LinkProfile]) -> UplinkModel:
        shaped = {(float(r), f, n): fit for (r, f, n), fit in fits.items() if r != UNSHAPED}
        if (UNSHAPED, 1, 2) not in fits or not any((f, n) == (1, 2) for _, f, n in shaped):
            raise ValueError("fit the unshaped link (2 nodes, one flow) and at least one shaped "
                             f"rate with one flow on 2 nodes (fitted: {sorted(fits)}); add them "
                             "to --fit-rates")
        bare = {(f, n): f * fit.bandwidth_gbs for (r, f, n), fit in fits.items()
                if r == UNSHAPED}
        unpaired = sorted({(f, n) for _, f, n in shaped} - set(bare))
        if unpaired:
            raise ValueError(f"shaped fits with (flows, nodes) {unpaired} have no fit of the "
                             "bare link with as many: add 'none' to --fit-rates")
        # (flows, nodes) -> [(rate, their total bytes/s)] of the shaped fits
        points: dict[tuple[int, int], list[tuple[float, float]]] = {}
        for (r, f, n), fit in sorted(shaped.items()):
            points.setdefault((f, n), []).append((r, f * fit.bandwidth_gbs))
        p = fit_sharpness(points, bare)
        eff = {key: statistics.median(efficiency(total, r, bare[key], p) for r, total in pts)
               for key, pts in points.items()}
        alpha = statistics.median(fit.latency_us for (_, f, n), fit in shaped.items()
                                  if (f, n) == (1, 2))
        return cls(fits[(UNSHAPED, 1, 2)], eff, bare, alpha, fits, p)

    def uplink(self, rate_mbit: float | None, flows: int = 1, nodes: int = 2) -> LinkProfile:
        """One of `flows` ranks sending through the node's uplink at once, at a rate (None:
        unshaped), per direction, while `nodes` nodes send. Transfers that keep it full
        (full_gbs) get the shaped rate less the TCP/IP headers (TCP_PAYLOAD_SHARE), where the
        ring collectives got less (their fitted efficiency), up to what one flow got on the
        bare link."""
        bare = self._fitted(self.unshaped_total, "fit of the bare link", flows, nodes)
        one_flow = self.unshaped.bandwidth_gbs  # the bare link's cap of one flow
        if rate_mbit is None:
            return dataclasses.replace(self.unshaped, bandwidth_gbs=bare / flows,
                                       busy_fraction=1.0, full_gbs=one_flow)
        eff = self._fitted(self.efficiency, "shaped uplink fit", flows, nodes)
        bw = soft_min(eff * rate_mbit / 8e3, bare, self.sharpness)
        full = soft_min(TCP_PAYLOAD_SHARE * rate_mbit / 8e3, one_flow, self.sharpness)
        return LinkProfile(latency_us=max(self.latency_us, self.unshaped.latency_us),
                           bandwidth_gbs=bw / flows, p2p_latency_us=self.unshaped.p2p_latency_us,
                           busy_fraction=bw / bare, full_gbs=full)

    def bare_rate_mbit(self, flows: int = 1, nodes: int = 2) -> float:
        """The rate (Mbit/s) at which the shaped uplink's nominal share, efficiency x R / 8,
        is what the bare link carries: the knee above which a shaping hardly binds, and where
        the bare link stands on a rate axis."""
        bare = self._fitted(self.unshaped_total, "fit of the bare link", flows, nodes)
        return bare / self._fitted(self.efficiency, "shaped uplink fit", flows, nodes) * 8e3

    @staticmethod
    def _fitted(table: dict[tuple[int, int], float], what: str, flows: int, nodes: int
                ) -> float:
        """table[(flows, nodes)], or the error that names the fits to run."""
        if (flows, nodes) not in table:
            raise ValueError(
                f"no {what} with {nodes} nodes x {flows} flow(s) at once (fitted (flows, "
                f"nodes): {sorted(table)}); run studies/emulated_model.py --measure with "
                f"--fit-flows {flows} and --fit-nodes {nodes}")
        return table[(flows, nodes)]

    @classmethod
    def from_dict(cls, doc: dict) -> UplinkModel:
        """Back from as_dict: the model fitted again from the fits it records."""
        fits = {}
        for key, fit in doc["fits"].items():
            match = FIT_KEY.fullmatch(key)
            if match is None:
                raise ValueError(f"an uplink fit is keyed {key!r}, not "
                                 "'<rate> Mbit/s, <flows> flow(s), <nodes> nodes'")
            rate, flows, nodes = match.groups()
            fits[(rate, int(flows), int(nodes))] = LinkProfile(**fit)
        return cls.from_fits(fits)

    def as_dict(self) -> dict:
        return {"unshaped": dataclasses.asdict(self.unshaped),
                "efficiency": {f"{n} nodes x {f} flow(s)": e
                               for (f, n), e in self.efficiency.items()},
                "unshaped_total_gbs": {f"{n} nodes x {f} flow(s)": b
                                       for (f, n), b in self.unshaped_total.items()},
                "latency_us": self.latency_us,
                "sharpness": str(self.sharpness),
                "fits": {f"{r} Mbit/s, {f} flow(s), {n} nodes": dataclasses.asdict(fit)
                         for (r, f, n), fit in self.fits.items()}}


def local_profile(results: Path) -> tuple[PerfProfile, str]:
    """The local cluster's profile (its calibration JSON under `results` when there is one)."""
    cfg = compose_experiment("local_3d", [f"launch.results_dir={results}"])
    resolved = resolve_profile(cfg)
    return resolved.profile, resolved.origin


def emulated_profile(base: PerfProfile, links: UplinkModel, rate_mbit: float | None,
                     sharing: int, codecs: dict[str, CodecProfile] | None = None,
                     nodes: int = 2) -> PerfProfile:
    """The local profile with the emulated links: per rank, `sharing` ranks per uplink."""
    inter = links.uplink(rate_mbit, sharing, nodes)
    # a node's ranks talk over the same kind of bare veths while the other nodes' ranks do
    # too: the bare fit with as many flows per node and nodes at once (2x2 sweep: TP all-
    # reduces got 19 MB/s a flow, where the one-flow fit slowed by 4 ranks on 2 cores said 13)
    intra = dataclasses.replace(links.uplink(None, sharing, nodes), fitted_under_load=True)
    return dataclasses.replace(base, intra=intra, inter=inter, codecs=codecs or base.codecs,
                               calibration=None, source="local profile + emulated uplinks "
                               "fitted by neoxlab.perfmodel.emulated")


def sweep_config(scheme: str, rate: str, layout_overrides: list[str], model: str) -> Config:
    return compose_experiment("emulated_sweep", [
        f"compression={scheme}", f"model={model}", *layout_overrides,
        f"cluster.emulated.inter.rate_mbit={'null' if rate == UNSHAPED else rate}"])


def predict_point(cfg: Config, base: PerfProfile, links: UplinkModel,
                  codecs: dict[str, CodecProfile] | None, external: float | None
                  ) -> Prediction:
    rate = cfg.cluster.emulated.inter.rate_mbit
    sharing = cfg.cluster.ranks_per_node
    profile = emulated_profile(base, links, rate, sharing, codecs, cfg.cluster.nodes)
    return predict_with(cfg, resolve_layout(cfg), profile, "emulated", external)


def crossover(rates: list[float], gains: list[float]) -> float | None:
    """The highest rate (Mbit/s) below which the gain is positive: where the scheme starts to
    pay, interpolated on log(rate) between the two points around the sign change; None when
    it pays everywhere or nowhere in the range."""
    pts = sorted(zip(rates, gains, strict=True), reverse=True)  # fast links first
    for (r_hi, g_hi), (r_lo, g_lo) in zip(pts, pts[1:], strict=False):
        if g_hi <= 0 < g_lo:
            t = g_hi / (g_hi - g_lo)
            return math.exp(math.log(r_hi) + t * (math.log(r_lo) - math.log(r_hi)))
    return None


def rated_gains(rows: list[dict], bare_rate: float) -> tuple[list[float], list[float]]:
    """A scheme's measured gains (sweep rows: rate_mbit, gain_samples) on the axis of the
    rate its uplink behaves as: the bare link at `bare_rate` (UplinkModel.bare_rate_mbit), a
    shaped rate above it there too, as the shaping does not bind; the gains of one rate are
    averaged (they measured the same link). So a crossover between the fastest shaped rate
    and the bare link is found, as the model's curve finds it."""
    by_rate: dict[float, list[float]] = {}
    for r in rows:
        rate = bare_rate if r["rate_mbit"] == UNSHAPED else min(float(r["rate_mbit"]), bare_rate)
        by_rate.setdefault(rate, []).append(float(r["gain_samples"]))
    rates = sorted(by_rate)
    return rates, [statistics.mean(by_rate[r]) for r in rates]


def codec_scale(measured_s: list[float], predicted_s: list[float]) -> float:
    """How much slower the codecs ran inside the training runs than the model has them, as
    one time-weighted ratio over the given runs (the sweep's fit-rate points): the codecs
    timed alone on one thread moved by up to 1.5x between sessions (zfp rate 8 encode 0.228,
    0.260 and 0.344 GB/s in three chains) and the runs' codec times did not follow, so the
    one-thread profile is scaled to what the runs at the fit rates showed."""
    if not measured_s or sum(predicted_s) <= 0:
        raise ValueError("no compressed run at a fit rate to scale the codecs to; sweep a fit "
                         "rate (e.g. 200 Mbit/s) with the compressed schemes")
    return sum(measured_s) / sum(predicted_s)


def scaled_codecs(codecs: dict[str, CodecProfile], factor: float) -> dict[str, CodecProfile]:
    """Every codec `factor` times slower (throughputs divided, per-call costs multiplied)."""
    return {name: dataclasses.replace(c, encode_gbs=c.encode_gbs / factor,
                                      decode_gbs=c.decode_gbs / factor,
                                      call_us=c.call_us * factor)
            for name, c in codecs.items()}
