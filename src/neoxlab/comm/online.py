"""compression=auto's re-check: each dimension's link as the performance model sees it,
estimated from the comm seconds a window of steps measured, and a new codec for a dimension
whose link has left the margin around the one its codec was chosen for.

The model's side comes precomputed (tune/online.py writes it into the run dir when the run
is planned): per dimension, on a grid of link bandwidths around the profile's, every
option's predicted comm and codec seconds per step and the two terms task=tune's margin
rule weighs (tune/choose.py): its saving over uncompressed and the seconds it trades. What
runs here is interpolation on that grid, so the training loop (which may not import the
model) runs it between steps.

Switching at most once per change: after a re-choice the dimension's reference link is the
link estimated then, whether or not its codec changed, and the dimension is re-chosen again
only when a later estimate leaves the margin around that one.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass, field

PLAN_FILE = "tune_online_plan.json"
RECORD_FILE = "tune_online.jsonl"
BASELINE = "none"


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """ys at x, piecewise linear in log(x) between the grid's points, held at its ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x) - 1
    t = (math.log(x) - math.log(xs[i])) / (math.log(xs[i + 1]) - math.log(xs[i]))
    return ys[i] + t * (ys[i + 1] - ys[i])


@dataclass
class Option:
    """One codec a dimension may run, with the model's terms at each grid bandwidth."""

    label: str  # a compressor spec: "none", "zfp:rate=8"
    setting: dict  # compression.dims.<dim> fields: compressor, params, min_bytes, error_feedback
    comm_s: list[float]  # predicted wire seconds per step of the dimension
    codec_s: list[float]  # predicted codec seconds per step of the dimension
    saving_s: list[float]  # step(uncompressed) - step(this option alone)
    traded_s: list[float]  # comm before + comm after + codec added (tune/choose.py)


@dataclass
class DimTable:
    """A dimension's options on the grid of its link's bandwidths (GB/s, ascending)."""

    dim: str
    link: str  # intra | inter: the profile's link this dimension's groups cross
    profile_gbs: float  # the profile's bandwidth of that link
    grid_gbs: list[float]
    options: list[Option]

    @classmethod
    def from_dict(cls, d: dict) -> DimTable:
        return cls(d["dim"], d["link"], d["profile_gbs"], list(d["grid_gbs"]),
                   [Option(**o) for o in d["options"]])

    def option(self, label: str) -> Option:
        for o in self.options:
            if o.label == label:
                return o
        raise KeyError(f"{self.dim}: no option {label!r} in the plan "
                       f"({[o.label for o in self.options]})")

    def predicted(self, label: str, gbs: float) -> tuple[float, float]:
        """(comm s, codec s) per step the model predicts for an option at a bandwidth."""
        o = self.option(label)
        return _interp(self.grid_gbs, o.comm_s, gbs), _interp(self.grid_gbs, o.codec_s, gbs)

    def link_for(self, label: str, comm_s: float) -> float:
        """The bandwidth at which the model predicts `comm_s` for this option: its comm
        seconds fall as the bandwidth grows, so the grid is searched from the slow end
        (held at the grid's ends)."""
        o, g = self.option(label), self.grid_gbs
        if comm_s >= o.comm_s[0]:
            return g[0]
        for i in range(len(g) - 1):
            hi, lo = o.comm_s[i], o.comm_s[i + 1]
            if hi >= comm_s >= lo:
                if hi == lo:
                    return g[i]
                t = (hi - comm_s) / (hi - lo)
                return math.exp(math.log(g[i]) + t * (math.log(g[i + 1]) - math.log(g[i])))
        return g[-1]

    def choose(self, gbs: float, margin: float) -> str:
        """tune/choose.py's rule at this bandwidth: of the options whose saving exceeds
        margin x the terms they trade, the one saving most; uncompressed when none does."""
        best, best_saving = BASELINE, 0.0
        for o in self.options:
            if o.label == BASELINE:
                continue
            saving = _interp(self.grid_gbs, o.saving_s, gbs)
            if saving > margin * _interp(self.grid_gbs, o.traded_s, gbs) and saving > best_saving:
                best, best_saving = o.label, saving
        return best


@dataclass
class Measured:
    """One dimension's step in a window (each rank's median step, averaged over the ranks
    that carried it)."""

    comm_s: float
    codec_s: float
    bytes_out: float


@dataclass
class DimCheck:
    dim: str
    codec: str  # the option it ran in the window
    measured_comm_s: float
    measured_codec_s: float
    measured_mb: float
    predicted_comm_s: float  # at the reference link
    predicted_codec_s: float
    reference_gbs: float | None  # None: not set yet (reference=measured)
    estimated_gbs: float
    changed: bool
    chosen: str  # the option from the next step on


@dataclass
class Decision:
    step: int
    margin: float
    dims: list[DimCheck] = field(default_factory=list)
    switches: dict[str, str] = field(default_factory=dict)  # dim -> new option
    note: str = ""

    def record(self) -> dict:
        return {"step": self.step, "margin": self.margin, "switches": self.switches,
                "note": self.note, "dims": [asdict(d) for d in self.dims]}


class Recheck:
    """The re-check's state on the rank that decides: each dimension's option and the link
    it was chosen for."""

    def __init__(self, tables: dict[str, DimTable], margin: float, current: dict[str, str],
                 reference: str = "profile"):
        self.tables, self.margin = tables, margin
        self.current = dict(current)
        # the link each option was chosen for: the profile's, or (reference=measured) the
        # first estimate
        self.reference: dict[str, float | None] = {
            d: (t.profile_gbs if reference == "profile" else None) for d, t in tables.items()}

    def outside(self, estimate: float, reference: float) -> bool:
        """The estimate left the model's margin around the reference link."""
        return not reference / (1 + self.margin) <= estimate <= reference * (1 + self.margin)

    def check(self, step: int, measured: dict[str, Measured]) -> Decision:
        """One re-check; the dimensions it re-chooses take the link estimated now as their
        reference, and the switches are applied to the state."""
        decision = Decision(step, self.margin)
        for dim, table in self.tables.items():
            m = measured.get(dim)
            if m is None or m.comm_s <= 0:
                continue  # no traffic measured on it in this window
            codec = self.current[dim]
            estimate = table.link_for(codec, m.comm_s)
            ref = self.reference[dim]
            pred_comm, pred_codec = table.predicted(codec, ref if ref is not None else estimate)
            changed = ref is not None and self.outside(estimate, ref)
            chosen = table.choose(estimate, self.margin) if changed else codec
            if ref is None or changed:
                self.reference[dim] = estimate
            if chosen != codec:
                decision.switches[dim] = chosen
                self.current[dim] = chosen
            decision.dims.append(DimCheck(
                dim, codec, m.comm_s, m.codec_s, m.bytes_out / 1e6, pred_comm, pred_codec, ref,
                estimate, changed, chosen))
        if any(d.reference_gbs is None for d in decision.dims):
            decision.note = "reference=measured: this estimate is the reference link"
        return decision
