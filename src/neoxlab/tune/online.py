"""compression=auto's plan: the performance model's side of the online re-check, priced when
the run dir is planned and written as tune_online_plan.json for the ranks.

Per dimension with traffic, the options are compression.auto.codecs (plus the starting
scheme's) that task=tune's candidate rules allow there and whose proxy error on seeded
stand-ins is within tune.error_budget. Each is priced as task=tune prices a candidate (alone
on its dimension, tune/choose.py) on a grid of bandwidths of the link the dimension crosses
(the profile's, scaled from 1/1024 to 8 x): its saving over uncompressed, the seconds it
trades, and its own comm and codec seconds per step, which the ranks set their measured
seconds against (comm/online.py). The margin is task=tune's (tune.margin, with its source).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

from omegaconf import OmegaConf

from neoxlab.comm.online import BASELINE, PLAN_FILE, DimTable, Option
from neoxlab.compress import parse_spec
from neoxlab.config import Config, ConfigError
from neoxlab.config.profile import PerfProfile
from neoxlab.files import REPO_ROOT
from neoxlab.layout import Layout
from neoxlab.perfmodel.predict import dim_seconds, spec_key
from neoxlab.run import rundir
from neoxlab.tune import guard, insitu, proxy
from neoxlab.tune.candidates import Candidate, Scheme, apply, dim_dtype, enumerate_candidates
from neoxlab.tune.choose import predict_scheme

GRID = [2 ** (k / 2) for k in range(-20, 7)]  # x the profile's bandwidth: 1/1024 .. 8


def write_plan(cfg: Config, layout: Layout, run_dir: Path) -> Path:
    """The plan (and the profile it was priced with) into a new run dir."""
    found = insitu.resolve(cfg, measure=insitu.runs_here(cfg) and cfg.cluster.emulated is None,
                           specs=cfg.compression.auto.codecs)
    insitu.write_into(run_dir, found)
    plan = build_plan(cfg, layout, found.profile, found.origin)
    path = run_dir / PLAN_FILE
    rundir.write_json(path, plan)
    return path


def build_plan(cfg: Config, layout: Layout, profile: PerfProfile, origin: str) -> dict:
    a, t = cfg.compression.auto, cfg.tune
    start, start_source = given_start(cfg)
    priced = _pricing_config(cfg, [*a.codecs, *(start or {}).values()])
    candidates, excluded = enumerate_candidates(priced, layout)
    notes = [f"{e.dim} {e.codec}: {e.reason}" for e in excluded]
    candidates, dropped = _within_budget(priced, candidates)
    notes += dropped
    tables: dict[str, DimTable] = {}
    for dim in dict.fromkeys(c.dim for c in candidates):
        table, why = _price_dim(priced, layout, profile, origin,
                                [c for c in candidates if c.dim == dim])
        notes += why
        if table is not None:
            tables[dim] = table
    if start is None:
        start = {d: tb.choose(tb.profile_gbs, t.margin) for d, tb in tables.items()}
    else:
        start = {d: start.get(d, BASELINE) for d in tables}
        missing = [f"{d}={c}" for d, c in start.items()
                   if c not in {o.label for o in tables[d].options}]
        if missing:
            raise ConfigError(f"compression=auto: the starting scheme's {missing} is not "
                              f"among the options priced ({notes or 'see tune.error_budget'}); "
                              "use compression.auto.start=model or another codec")
    return {"margin": t.margin, "margin_source": t.margin_source, "profile": origin,
            "recheck_every": a.recheck_every, "reference": a.reference, "start": start,
            "start_source": start_source, "allreduce": "auto", "notes": notes,
            "dims": {d: dataclasses.asdict(tb) for d, tb in tables.items()}}


def given_start(cfg: Config) -> tuple[dict[str, str] | None, str]:
    """The starting scheme as dim -> codec spec (None: the model's pick at the profile's
    link) and where it comes from."""
    a = cfg.compression.auto
    if a.start == "given":
        return ({d: spec_key(s.compressor, s.params) for d, s in cfg.compression.dims.items()},
                "compression.dims (compression.auto.start=given)")
    if a.start == "tuned":
        directory = Path(cfg.tune.config_dir)
        path = ((directory if directory.is_absolute() else REPO_ROOT / directory)
                / f"tuned_{cfg.experiment}.yaml")
        if path.exists():
            doc = OmegaConf.to_container(OmegaConf.load(path))
            body = doc.get("compression", doc)
            return ({d: spec_key(s["compressor"], s.get("params") or {})
                     for d, s in body.get("dims", {}).items()}, f"task=tune's pick ({path})")
        return None, f"the model's pick at the profile's link (no {path})"
    return None, "the model's pick at the profile's link (compression.auto.start=model)"


def _pricing_config(cfg: Config, codecs: list[str]) -> Config:
    """cfg with the options the patch can switch between steps: the codecs on the default
    all-reduce algorithm, no reduce to owners (a ZeRO setting, fixed at start-up), no error
    feedback."""
    out = copy.deepcopy(cfg)
    out.tune.codecs = list(dict.fromkeys(spec_key(*parse_spec(c)) for c in codecs))
    out.tune.allreduce, out.tune.reduce_to_owner, out.tune.error_feedback = ["auto"], [False], [
        False]
    return out


def _within_budget(cfg: Config, candidates: list[Candidate]) -> tuple[list[Candidate],
                                                                     list[str]]:
    """Stage (a) of task=tune's guard on seeded stand-ins of each dimension's dtype
    (parameter-like on ZeRO's all-gathers, proxy.stand_ins)."""
    tensors = proxy.stand_ins(cfg, {c.dim: dim_dtype(cfg, c.dim) for c in candidates})
    reference = cfg.tune.budget_reference
    specs = {c.codec for c in candidates} | ({reference} if reference else set())
    errors = proxy.errors(sorted(specs), tensors)
    _, verdicts = guard.stage_a([(c.dim, c.codec) for c in candidates], errors,
                                cfg.tune.error_budget, reference)
    kept, dropped = [], []
    for c in candidates:
        verdict = verdicts[(c.dim, c.codec)]
        if verdict.ok:
            kept.append(c)
        else:
            dropped.append(f"{c.dim} {c.codec}: {verdict.reason} (seeded stand-ins)")
    return kept, dropped


def scaled(profile: PerfProfile, kind: str, gbs: float) -> PerfProfile:
    """The profile with one link's bandwidth (and its full-link bandwidth alike) set."""
    link = getattr(profile, kind)
    full = None if link.full_gbs is None else link.full_gbs * gbs / link.bandwidth_gbs
    return dataclasses.replace(profile, **{kind: dataclasses.replace(
        link, bandwidth_gbs=gbs, full_gbs=full)})


def _price_dim(cfg: Config, layout: Layout, profile: PerfProfile, origin: str,
               options: list[Candidate]) -> tuple[DimTable | None, list[str]]:
    """One dimension's options on the grid; those the model cannot price are left out."""
    dim, margin = options[0].dim, cfg.tune.margin
    base = predict_scheme(cfg, Scheme(BASELINE), profile, origin, None, margin)
    if base.prediction is None:
        raise ConfigError(f"compression=auto: the uncompressed baseline cannot be predicted: "
                          f"{base.note}")
    kind = base.prediction.links[dim]
    ref = getattr(profile, kind).bandwidth_gbs
    grid = [ref * f for f in GRID]
    priced: dict[str, Option] = {}
    notes: list[str] = []
    for gbs in grid:
        p = scaled(profile, kind, gbs)
        base_g = predict_scheme(cfg, Scheme(BASELINE), p, origin, None, margin).prediction
        for c in options:
            if c.codec in notes:
                continue
            scheme = Scheme(f"{dim} {c.codec}", {dim: c})
            s = predict_scheme(cfg, scheme, p, origin, base_g, margin)
            if s.prediction is None:
                notes.append(c.codec)
                priced.pop(c.codec, None)
                continue
            comm, codec = dim_seconds(apply(cfg, scheme), layout, p, dim, kind)
            o = priced.setdefault(c.codec, Option(
                c.codec, dataclasses.asdict(c.setting(_min_bytes(cfg, dim))), [], [], [], []))
            o.comm_s.append(comm)
            o.codec_s.append(codec)
            o.saving_s.append(s.saving_s)
            o.traded_s.append(s.traded_s)
    out = [f"{dim} {codec}: the model cannot price it" for codec in notes]
    if BASELINE not in priced:
        return None, [*out, f"{dim}: uncompressed cannot be priced; not re-checked"]
    return DimTable(dim, kind, ref, grid, list(priced.values())), out


def _min_bytes(cfg: Config, dim: str) -> int:
    d = cfg.compression.dims.get(dim)
    return d.min_bytes if d is not None else cfg.tune.min_bytes
