"""What a tune leaves: the chosen scheme as a compression config the user runs as is
(<tune.config_dir>/tuned_<exp>.yaml, a configs/compression file), and the report table
<results>/tables/<exp>.tune.{parquet,csv,md}: every candidate and scheme with its predicted
step time, proxy error, guard verdict and whether it was chosen, and the tuner's own cost
(rows of kind "cost"). analysis/tune.py draws it (`make figures EXP=<exp>`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from neoxlab.config import Config
from neoxlab.config.profile import PerfProfile
from neoxlab.files import REPO_ROOT, now
from neoxlab.results.tables import write_table
from neoxlab.run import rundir
from neoxlab.tune.candidates import Candidate, Excluded, Scheme, apply
from neoxlab.tune.choose import Scored
from neoxlab.tune.guard import Verdict

COLUMNS = ("kind", "dim", "codec", "allreduce", "reduce_to_owner", "error_feedback", "label",
           "predicted_step_s", "predicted_samples_per_s", "saving_s", "margin_s", "margin_ok",
           "proxy_error", "budget", "proxy_ok", "probe_deviation", "probe_threshold",
           "guard", "chosen", "note", "cost_s")


@dataclass
class Outcome:
    """Everything a tune decided, for the table and the config."""

    experiment: str
    base: Scored
    candidates: list[Scored]
    excluded: list[Excluded]
    proxy: dict[tuple[str, str], float | None]  # (dim, codec) -> relative error
    proxy_verdicts: dict[tuple[str, str], Verdict]
    proxy_source: str
    schemes: list[Scored]
    scheme_verdicts: dict[str, Verdict]  # scheme label -> its guard verdict
    probes: dict[str, tuple[float, float]]  # scheme label -> (deviation, threshold)
    chosen: Scored
    cost_s: dict[str, float]  # stage -> wall seconds
    fixed: dict = field(default_factory=dict)  # fixed scheme -> Prediction, or why not
    notes: list[str] = field(default_factory=list)
    profile_origin: str = ""
    profile: PerfProfile | None = None  # the one predicted with (uplink bytes, ranked export)
    budgets: dict[str, float] = field(default_factory=dict)  # dim -> stage (a)'s budget


def candidate_row(cfg: Config, s: Scored, out: Outcome) -> dict:
    c = s.candidate
    key = (c.dim, c.codec)
    verdict = out.proxy_verdicts.get(key)
    margin = "baseline" if not (c.compressed or c.reduce_to_owner) else (
        "clears" if s.clears_margin else "below")
    guard = ("not predicted" if s.prediction is None else
             f"margin {margin}; proxy {'pass' if verdict and verdict.ok else 'fail'}: "
             f"{verdict.reason if verdict else 'not measured'}")
    budget = out.budgets.get(c.dim, cfg.tune.error_budget.get(c.dim))
    return _row("candidate", c, s, out.proxy.get(key), budget,
                verdict, guard, chosen=_in(c, out.chosen.scheme))


def scheme_row(cfg: Config, s: Scored, out: Outcome) -> dict:
    label = s.scheme.label
    verdict = out.scheme_verdicts.get(label)
    deviation, threshold = out.probes.get(label, (math.nan, math.nan))
    if verdict is not None:
        guard = verdict.reason
    elif not s.scheme.parts:
        guard = "the baseline"
    elif not s.clears_margin:
        guard = "below the margin"
    else:
        guard = "not probed: a faster scheme was chosen, or tune.finalists faster ones were"
    row = _row("scheme", None, s, None, None, None, guard, chosen=s is out.chosen)
    row.update(label=label, allreduce=s.scheme.allreduce,
               reduce_to_owner=s.scheme.reduce_to_owner, probe_deviation=deviation,
               probe_threshold=threshold)
    return row


def _row(kind: str, c: Candidate | None, s: Scored, proxy: float | None, budget: float | None,
         verdict: Verdict | None, guard: str, chosen: bool) -> dict:
    p = s.prediction
    return {
        "kind": kind, "dim": c.dim if c else "", "codec": c.codec if c else "",
        "allreduce": (c.allreduce or "") if c else "",
        "reduce_to_owner": c.reduce_to_owner if c else None,
        "error_feedback": c.error_feedback if c else None,
        "label": c.label if c else s.scheme.label,
        "predicted_step_s": p.step_s if p else math.nan,
        "predicted_samples_per_s": p.samples_per_s if p else math.nan,
        "saving_s": s.saving_s, "margin_s": s.threshold_s, "margin_ok": s.clears_margin,
        "proxy_error": math.nan if proxy is None else proxy,
        "budget": math.nan if budget is None else budget,
        "proxy_ok": verdict.ok if verdict else None,
        "probe_deviation": math.nan, "probe_threshold": math.nan,
        "guard": guard, "chosen": chosen, "note": s.note, "cost_s": math.nan,
    }


def _in(c: Candidate, scheme: Scheme) -> bool:
    part = scheme.parts.get(c.dim)
    if part is None:  # an uncompressed dimension: its plain candidate was chosen
        return not c.compressed and not c.reduce_to_owner
    return part == c


def table(cfg: Config, out: Outcome) -> pd.DataFrame:
    rows = [candidate_row(cfg, s, out) for s in out.candidates]
    rows += [{**_blank(), "kind": "excluded", "dim": e.dim, "codec": e.codec,
              "label": e.codec, "guard": "not tried", "note": e.reason} for e in out.excluded]
    rows += [scheme_row(cfg, s, out) for s in out.schemes]
    rows += [fixed_row(name, p) for name, p in out.fixed.items()]
    rows += [{**_blank(), "kind": "cost", "label": stage, "cost_s": seconds}
             for stage, seconds in out.cost_s.items()]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def fixed_row(name: str, p) -> dict:
    if isinstance(p, str):
        return {**_blank(), "kind": "fixed", "label": name, "note": p}
    return {**_blank(), "kind": "fixed", "label": name, "predicted_step_s": p.step_s,
            "predicted_samples_per_s": p.samples_per_s, "guard": "fixed scheme, not guarded"}


def gains(out: Outcome) -> dict[str, float]:
    """The pick's predicted samples/s gain over each fixed scheme, in %."""
    c = out.chosen.prediction
    return {name: (p.step_s / c.step_s - 1) * 100 for name, p in out.fixed.items()
            if not isinstance(p, str)}


def _blank() -> dict:
    return {k: None for k in COLUMNS} | {"chosen": False, "note": "", "guard": "", "dim": "",
                                         "codec": "", "allreduce": "", "label": ""}


def write_tables(frame: pd.DataFrame, out: Outcome, tables: Path) -> list[Path]:
    tables.mkdir(parents=True, exist_ok=True)
    paths = [tables / f"{out.experiment}.tune{s}" for s in (".parquet", ".csv", ".md")]
    write_table(frame, paths[0])
    write_table(frame, paths[1])
    rundir.write_atomic(paths[2], markdown(frame, out))
    return paths


def markdown(frame: pd.DataFrame, out: Outcome) -> str:
    shown = frame[frame["kind"] != "cost"].copy()
    for col in ("predicted_step_s", "saving_s", "margin_s"):
        shown[col] = shown[col].map(lambda v: "" if v is None or v != v else f"{v:.4g}")
    shown["proxy_error"] = shown["proxy_error"].map(
        lambda v: "" if v is None or v != v else f"{v:.3g}")
    cols = ["kind", "dim", "label", "predicted_step_s", "saving_s", "margin_s", "proxy_error",
            "guard", "chosen", "note"]
    lines = [f"# task=tune: {out.experiment}", "", summary(out), "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in shown[cols].iterrows():
        lines.append("| " + " | ".join(str(r[c]).replace("|", "/").replace("\n", " ")
                                       for c in cols) + " |")
    lines += ["", "Tuner cost (wall s): " + ", ".join(
        f"{k} {v:.1f}" for k, v in out.cost_s.items())]
    return "\n".join(lines) + "\n"


def summary(out: Outcome) -> str:
    b, c = out.base.prediction, out.chosen.prediction
    gain = (b.step_s / c.step_s - 1) * 100
    lines = [f"Chosen: {out.chosen.scheme.label} (predicted step {c.step_s:.4g} s, "
             f"{c.samples_per_s:.4g} samples/s; baseline {b.step_s:.4g} s: {gain:+.1f} % "
             "samples/s)",
             f"Profile: {out.profile_origin}", f"Proxy tensors: {out.proxy_source}"]
    if out.fixed:
        found = gains(out)
        lines.append("Predicted gain over the fixed schemes: " + ", ".join(
            f"{name} {g:+.1f} %" for name, g in found.items()))
        if found:  # the best fixed scheme is the best of all compared, whatever its codec
            best = min(found, key=found.get)
            lines.append(f"Best fixed scheme (of {len(found)}): {best}, predicted gain over it "
                         f"{found[best]:+.1f} %")
    lines += [f"Note: {n}" for n in out.notes]
    return "\n".join(lines)


def render_scheme(cfg: Config, scheme: Scheme, name: str, header: list[str]) -> str:
    """The scheme as the text of configs/compression/<name>.yaml (its `scheme:` is `name`,
    so `compression=<name>` runs it), `header` as its first comment lines. A changed
    zero.reduce_to_owner needs the global package, so the file then sets both."""
    applied = apply(cfg, Scheme(name, scheme.parts))
    c = applied.compression
    body = {"scheme": name, "backend": "framework", "patch": True, "allreduce": c.allreduce,
            "dims": {dim: {"compressor": d.compressor, "params": dict(d.params),
                           "min_bytes": d.min_bytes, "error_feedback": d.error_feedback}
                     for dim, d in c.dims.items() if d.compressor != "none"}}
    lines = [f"# {line}" for line in header]
    if applied.zero.reduce_to_owner != cfg.zero.reduce_to_owner:
        lines.insert(0, "# @package _global_")
        data = {"compression": body, "zero": {"reduce_to_owner": applied.zero.reduce_to_owner}}
    else:
        data = body
    return "\n".join(lines) + "\n" + yaml.safe_dump(data, sort_keys=False)


def write_config(cfg: Config, out: Outcome, run_dir: Path) -> Path:
    """The chosen scheme as configs/compression/tuned_<exp>.yaml (or tune.config_dir):
    `make run EXP=<exp> compression=tuned_<exp>` runs it."""
    name = f"tuned_{cfg.experiment}"
    b, p = out.base.prediction, out.chosen.prediction
    verdict = out.scheme_verdicts.get(out.chosen.scheme.label, Verdict(True, "the baseline"))
    header = [f"Chosen by task=tune for experiment {cfg.experiment} ({now()}; {run_dir}).",
              f"Predicted step {p.step_s:.4g} s against {b.step_s:.4g} s uncompressed "
              f"({(b.step_s / p.step_s - 1) * 100:+.1f} % samples/s); guard: "
              f"{verdict.reason}.",
              f"Run: make run EXP={cfg.experiment} task=train compression={name}"]
    text = render_scheme(cfg, out.chosen.scheme, name, header)
    directory = Path(cfg.tune.config_dir)
    path = (directory if directory.is_absolute() else REPO_ROOT / directory) / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    rundir.write_atomic(path, text)
    rundir.write_atomic(run_dir / f"{name}.yaml", text)
    return path
