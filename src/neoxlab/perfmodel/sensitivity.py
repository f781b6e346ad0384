"""How far each assumption of a prediction moves the predicted gains, and what it alone would
have to be for the published ones: a table of what-ifs, never a fit.

Every row changes one input of the base case (the grid's members at the published GPU count,
the cluster profile, the engines' wire dtypes; the inputs and their values: what_ifs.py) and
predicts the gains of every compressed scheme over the baseline again. For each assumption,
the value it alone would need for each published gain is solved (bisection on a continuous
input whose gain is monotone; a scan of an integer one; the listed values of a discrete one)
or reported as not reachable. Nothing solved here is used by any prediction: the published
gains are targets to compare with, not data the model is fitted to.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from neoxlab.config import Config
from neoxlab.config.profile import PerfProfile
from neoxlab.perfmodel.predict import gain_pct, predict
from neoxlab.perfmodel.published import TARGETS

BASELINE = "none"
SCHEMES = ("naive", "zhybrid", "mzhybrid")
METRIC = {"tflops": "tflops_per_gpu", "samples": "samples_per_s"}
SAMPLES = 13  # points a continuous input is sampled at to check that its gain is monotone


@dataclass(frozen=True)
class Case:
    """What one row predicts: every scheme's config, the profile, the wire dtypes changed."""

    configs: dict[str, Config]  # scheme -> config, the baseline included
    profile: PerfProfile
    dtypes: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def gains(case: Case) -> dict[tuple[str, str], float]:
    """(scheme, metric) -> predicted gain % over the baseline."""
    preds = {s: predict(c, case.profile, dtypes=case.dtypes) for s, c in case.configs.items()}
    base = preds[BASELINE]
    return {(s, m): gain_pct(getattr(preds[s], col), getattr(base, col))
            for s in SCHEMES if s in preds for m, col in METRIC.items()}


@dataclass(frozen=True)
class Value:
    """One value of an assumption: a label, how it is known, and what it changes."""

    label: str
    mark: str  # "published: <source>" | "measured: <source>" | "assumed: <reason>"
    apply: Callable[[Case], Case]
    # the value the best-supported prediction takes (published or measured for the paper's
    # runs); where no value of an assumption is, its first (the base case's) stays
    best: bool = False


@dataclass(frozen=True)
class Knob:
    """An assumption as a number, for solving: x -> case, over [lo, hi]."""

    apply: Callable[[Case, float], Case]
    lo: float
    hi: float
    fmt: Callable[[float], str]
    log: bool = False  # sample and bisect on a log scale
    integer: bool = False  # scan every integer instead of bisecting


@dataclass(frozen=True)
class Assumption:
    name: str
    values: list[Value]
    knob: Knob | None = None  # None: discrete, needed = the listed values that reach it
    combined: bool = False  # several inputs at once: no base value, not a best-supported one


# ---- solving ------------------------------------------------------------------------------

@dataclass
class Row:
    assumption: str
    value: str
    mark: str
    gains: dict[tuple[str, str], float]
    needed: dict[tuple[str, str], str] = field(default_factory=dict)  # first row only
    notes: tuple[str, ...] = ()


def needed(a: Assumption, base: Case, rows: list[Row], scheme: str, metric: str,
           target: float) -> str:
    """What the assumption alone would need for `target` % of `scheme` on `metric`."""
    if a.knob is None:
        reach = [r.value for r in rows if r.gains[(scheme, metric)] >= target]
        return "; ".join(reach) if reach else "not reachable"
    k = a.knob

    def miss(x: float) -> float:
        return gains(k.apply(base, x))[(scheme, metric)] - target

    if k.integer:
        xs = list(range(int(k.lo), int(k.hi) + 1))
    elif k.log:
        xs = [k.lo * (k.hi / k.lo) ** (i / (SAMPLES - 1)) for i in range(SAMPLES)]
    else:
        xs = [k.lo + (k.hi - k.lo) * i / (SAMPLES - 1) for i in range(SAMPLES)]
    misses = [miss(x) for x in xs]
    if k.integer:
        reach = [x for x, m in zip(xs, misses, strict=True) if m >= 0]
        if not reach:
            return "not reachable"
        return k.fmt(reach[0]) if len(reach) == len(xs) else _span(reach, k.fmt)
    steps = [b - a for a, b in zip(misses, misses[1:], strict=False)]
    if not (all(s >= 0 for s in steps) or all(s <= 0 for s in steps)):
        return "not reachable (gain not monotone)" if all(m < 0 for m in misses) else \
            "not monotone"
    if misses[0] * misses[-1] > 0:
        return f"not reachable in {k.fmt(k.lo)}..{k.fmt(k.hi)}"
    return k.fmt(_bisect(miss, k.lo, k.hi, k.log, misses[0]))


def _span(reach: list[int], fmt: Callable[[float], str]) -> str:
    if reach == list(range(reach[0], reach[-1] + 1)):
        return f"{fmt(reach[0])}..{fmt(reach[-1])}"
    return ", ".join(fmt(x) for x in reach)


def _bisect(miss: Callable[[float], float], lo: float, hi: float, log: bool, f_lo: float
            ) -> float:
    to = (lambda x: math.log(x)) if log else (lambda x: x)
    back = (lambda y: math.exp(y)) if log else (lambda y: y)
    a, b = to(lo), to(hi)
    for _ in range(50):
        mid = (a + b) / 2
        f_mid = miss(back(mid))
        if f_lo * f_mid <= 0:
            b = mid
        else:
            a, f_lo = mid, f_mid
    return back((a + b) / 2)


def table(base: Case, assumptions: list[Assumption]) -> list[Row]:
    """Every assumption's rows; its first row carries what it alone would need (a combined
    one: what its knob would need on top of the combination)."""
    out: list[Row] = []
    for a in assumptions:
        rows = []
        for v in a.values:
            case = v.apply(base)
            rows.append(Row(a.name, v.label, v.mark, gains(case), notes=case.notes))
        rows[0].needed = {(s, m): needed(a, base, rows, s, m, t) for s, m, t in TARGETS}
        out += rows
    return out


def best_supported(base: Case, assumptions: list[Assumption]) -> tuple[Case, list[str]]:
    """The base case with each assumption's best-supported value; the assumptions whose value
    there is still an assumption, named with it."""
    case = base
    assumed: list[str] = []
    for a in assumptions:
        if a.combined:
            continue
        chosen = next((v for v in a.values if v.best), a.values[0])
        case = chosen.apply(case)
        if chosen.mark.startswith("assumed"):
            assumed.append(f"{a.name} = {chosen.label}")
    return case, assumed
