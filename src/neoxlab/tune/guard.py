"""The loss guard's verdicts, from numbers already measured (no run starts here).

- Stage (a), per candidate: its codec's relative error on the dimension's captured messages
  against the dimension's error budget (the map's, or naive's codec's error on the same
  messages where that is larger: budgets()); lossless codecs pass.
- Stage (b), per probed scheme: its loss, step by step after the shared checkpoint, against
  the baseline of the same seed from the same checkpoint. The threshold is learnt from
  noise: noise_factor x the mean per-step gap between the baseline and uncompressed runs
  from the same checkpoint on other data orders, over the same steps.
- Silent failure, per run: a loss that is not finite or never moves, a gradient norm that is
  zero or not finite, a dimension meant to be compressed whose bytes on the wire
  (comm.jsonl) did not shrink or a dimension meant to be raw that was compressed, and on
  the emulated cluster uplinks that carried other than what the accounting says.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from neoxlab.compress import make_compressor

CONSTANT_LOSS_RTOL = 1e-9  # a loss that moves less than this (relative) over a run is stuck
UPLINK_TOLERANCE = 0.10  # emulated uplinks' TCP payload vs the accounting (docs/emulated.md)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str


def budgets(error_budget: Mapping[str, float], reference: str,
            errors: Mapping[tuple[str, str], float | None]) -> dict[str, float]:
    """Per dimension the larger of the map's budget and the error of naive's codec
    (`reference`, tune.budget_reference) on the same tensors. The map set its budgets on
    neox_tiny's tensors, where naive's ZFP rate 8 was harmless on every dimension and erred
    0.0039 on ZeRO's parameters; on neox_small's parameters it errs 0.0071 (LayerNorm's ones
    weigh less in the norm), so an absolute budget would reject naive's own codec there. The
    tuner promises no worse than naive: naive's codec passes wherever it runs."""
    out = dict(error_budget)
    for (dim, spec), error in errors.items():
        if reference and spec == reference and error is not None and math.isfinite(error):
            out[dim] = max(error_budget.get(dim, math.inf), error)
    return out


def stage_a(options: Iterable[tuple[str, str]], errors: Mapping[tuple[str, str], float | None],
            error_budget: Mapping[str, float], reference: str
            ) -> tuple[dict[str, float], dict[tuple[str, str], Verdict]]:
    """Each dimension's budget (budgets()) and each (dim, codec spec) option's verdict."""
    limits = budgets(error_budget, reference, errors)
    return limits, {(dim, spec): proxy_verdict(errors.get((dim, spec)),
                                               limits.get(dim, math.inf),
                                               make_compressor(spec).lossless)
                    for dim, spec in options}


def proxy_verdict(error: float | None, budget: float, lossless: bool) -> Verdict:
    if lossless:
        return Verdict(True, "lossless")
    if error is None:
        return Verdict(False, "no message of this dimension was captured")
    if not error <= budget:  # NaN fails too
        return Verdict(False, f"proxy error {error:.3g} > budget {budget:.3g}")
    return Verdict(True, f"proxy error {error:.3g} <= budget {budget:.3g}")


def sanity(records: list[dict]) -> list[str]:
    """Silent failures in a run's metrics.jsonl records (empty: none)."""
    if not records:
        return ["no step logged"]
    problems = []
    losses = [r.get("loss") for r in records]
    bad = [r["step"] for r, v in zip(records, losses, strict=True)
           if v is None or not math.isfinite(v)]
    if bad:
        problems.append(f"loss not finite at steps {bad[:5]}")
    finite = [v for v in losses if v is not None and math.isfinite(v)]
    if len(finite) >= 2:
        spread = max(finite) - min(finite)
        if spread <= CONSTANT_LOSS_RTOL * max(abs(v) for v in finite):
            problems.append(f"constant loss {finite[0]:.6g} over {len(finite)} steps")
    norms = [r.get("grad_norm") for r in records]
    if any(n is not None and not math.isfinite(n) for n in norms):
        problems.append("gradient norm not finite")
    seen = [n for n in norms if n is not None and math.isfinite(n)]
    if seen and all(n == 0.0 for n in seen):
        problems.append(f"zero gradient norm on all {len(seen)} logged steps")
    return problems


def deviation(losses: dict[int, float], reference: dict[int, float], steps: list[int]
              ) -> float:
    """Mean |loss - reference| over the steps both logged (NaN when none)."""
    both = [s for s in steps if s in losses and s in reference]
    if not both:
        return math.nan
    return sum(abs(losses[s] - reference[s]) for s in both) / len(both)


def noise_threshold(baseline: dict[int, float], others: list[dict[int, float]],
                    steps: list[int], factor: float) -> float:
    """factor x the largest mean per-step gap between the baseline and a noise run's."""
    gaps = [deviation(o, baseline, steps) for o in others]
    gaps = [g for g in gaps if math.isfinite(g)]
    if not gaps:
        return math.nan
    return factor * max(gaps)


def probe_verdict(losses: dict[int, float], baseline: dict[int, float], steps: list[int],
                  threshold: float) -> tuple[Verdict, float]:
    """A probe against the same-seed baseline over the probe's steps."""
    d = deviation(losses, baseline, steps)
    if not math.isfinite(threshold):
        return Verdict(False, "no noise run measured to set the threshold"), d
    if not math.isfinite(d):
        return Verdict(False, "no step in common with the baseline"), d
    if d > threshold:
        return Verdict(False, f"deviates {d:.3g} from the same-seed baseline > threshold "
                              f"{threshold:.3g} (noise from the checkpoint)"), d
    return Verdict(True, f"deviates {d:.3g} <= threshold {threshold:.3g}, within the noise "
                         "from the checkpoint"), d


def wire_problems(totals: dict[str, dict], meant: dict[str, bool]) -> list[str]:
    """comm.jsonl totals per dimension against what the scheme meant: `meant[dim]` True
    for a dimension whose codec shrinks its messages, False for one left raw."""
    problems = []
    for dim, compressed in sorted(meant.items()):
        t = totals.get(dim)
        if t is None:
            if compressed:
                problems.append(f"{dim}: meant to be compressed, but no call was accounted")
            continue
        if compressed and t["compressed_calls"] == 0:
            problems.append(f"{dim}: meant to be compressed, but none of its "
                            f"{t['calls']} calls was")
        elif compressed and t["bytes_out"] >= t["bytes_in"]:
            problems.append(f"{dim}: compressed calls saved nothing on the wire "
                            f"({t['bytes_out']} of {t['bytes_in']} bytes sent)")
        elif not compressed and t["compressed_calls"] > 0:
            problems.append(f"{dim}: meant to be raw, but {t['compressed_calls']} calls were "
                            "compressed")
    return problems


def uplink_problems(carried: float, accounted: float) -> list[str]:
    """Emulated uplinks' TCP payload against the bytes the accounting puts between nodes."""
    if accounted <= 0:
        return []
    if abs(carried - accounted) > UPLINK_TOLERANCE * accounted:
        return [f"uplinks carried {carried:.0f} bytes of payload, the accounting says "
                f"{accounted:.0f} between nodes (more than {UPLINK_TOLERANCE:.0%} apart)"]
    return []
