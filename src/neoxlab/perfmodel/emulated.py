"""The performance model on an emulated cluster: the uplink's alpha-beta fitted from gloo
all-reduce and all-gather sweeps (up to 4 MiB) run inside the namespaces, the rest from the
local profile.

An uplink shaped to R Mbit/s carries at most R/8 MB/s per direction; TCP/IP headers and the
token bucket take a share of it, so the link model is

    B(R) = min(B_unshaped, efficiency x R / 8)     (per node, per direction)
    alpha(R) = the median alpha of the shaped fits  (tbf adds queueing, not a fixed delay)

with `efficiency` the median of B_fit / (R / 8) over the shaped fit rates; a node's ranks
reduce at once (one in each DP group), so each rank gets B(R) / ranks_per_node (the model's
per-rank convention, as configs/cluster/lassen.yaml's inter link). Compute, framework
overheads and the codecs come from the local profile (this machine's cores: the same ones
the emulated nodes run on), the codecs timed again here on one thread.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from neoxlab.config import Config
from neoxlab.config.compose import compose_experiment
from neoxlab.config.profile import CodecProfile, LinkProfile, PerfProfile
from neoxlab.layout import resolve_layout
from neoxlab.perfmodel.fit import BANDWIDTH_BENCHMARKS, fit_alpha_beta
from neoxlab.perfmodel.predict import Prediction, _predict
from neoxlab.perfmodel.resolve import resolve_profile

UNSHAPED = "none"


def read_omb(run_dir: Path) -> list[dict]:
    """The all-reduce and all-gather rows rank 0 wrote (omb.jsonl of an emulated_omb run)."""
    lines = (run_dir / "omb.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["benchmark"] in BANDWIDTH_BENCHMARKS]


def fit_rate(rows: list[dict]) -> LinkProfile:
    """alpha-beta of one rate's sweeps (2 ranks, one per node), every benchmark at once."""
    return fit_alpha_beta([(b, 2, [r for r in rows if r["benchmark"] == b], 1.0)
                           for b in BANDWIDTH_BENCHMARKS])


@dataclass(frozen=True)
class UplinkModel:
    unshaped: LinkProfile  # the bare veth path (also the intra-node link: the same veths)
    efficiency: float  # fitted bytes/s over the nominal R/8
    latency_us: float  # alpha of the shaped fits
    fits: dict[str, LinkProfile]  # rate (Mbit/s, or "none") -> its own fit

    @classmethod
    def from_fits(cls, fits: dict[str, LinkProfile]) -> UplinkModel:
        shaped = {float(r): f for r, f in fits.items() if r != UNSHAPED}
        if UNSHAPED not in fits or not shaped:
            raise ValueError("fit the unshaped link and at least one shaped rate "
                             f"(fitted: {sorted(fits)}); add them to --fit-rates")
        eff = statistics.median(f.bandwidth_gbs / (r / 8e3) for r, f in shaped.items())
        alpha = statistics.median(f.latency_us for f in shaped.values())
        return cls(fits[UNSHAPED], eff, alpha, fits)

    def uplink(self, rate_mbit: float | None) -> LinkProfile:
        """The node's link at a rate (None: unshaped), per node and direction."""
        if rate_mbit is None:
            return self.unshaped
        bw = min(self.unshaped.bandwidth_gbs, self.efficiency * rate_mbit / 8e3)
        return LinkProfile(latency_us=max(self.latency_us, self.unshaped.latency_us),
                           bandwidth_gbs=bw, p2p_latency_us=self.unshaped.p2p_latency_us)

    def as_dict(self) -> dict:
        return {"unshaped": dataclasses.asdict(self.unshaped), "efficiency": self.efficiency,
                "latency_us": self.latency_us,
                "fits": {r: dataclasses.asdict(f) for r, f in self.fits.items()}}


def local_profile(results: Path) -> tuple[PerfProfile, str]:
    """The local cluster's profile (its calibration JSON under `results` when there is one)."""
    cfg = compose_experiment("local_3d", [f"launch.results_dir={results}"])
    resolved = resolve_profile(cfg)
    return resolved.profile, resolved.origin


def emulated_profile(base: PerfProfile, links: UplinkModel, rate_mbit: float | None,
                     sharing: int, codecs: dict[str, CodecProfile] | None = None
                     ) -> PerfProfile:
    """The local profile with the emulated links: per rank, `sharing` ranks per uplink."""
    up = links.uplink(rate_mbit)
    inter = dataclasses.replace(up, bandwidth_gbs=up.bandwidth_gbs / sharing)
    intra = dataclasses.replace(links.unshaped)
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
    profile = emulated_profile(base, links, rate, sharing, codecs)
    return _predict(cfg, resolve_layout(cfg), profile, "emulated", external)


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
