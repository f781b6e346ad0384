"""The profile a prediction of this experiment uses, measured where its ranks run when it can
be, and cached with its provenance.

- A cluster with its own profile (configs/cluster/*.yaml, plus its calibration file):
  that profile. When its ranks run on this machine's kind of device (CPU), every codec
  the experiment may use is timed here too, at its own parameters (ZFP's rate sets how many
  bit planes it codes), and replaces the profile's entry.
- The emulated cluster: the local profile (this machine's cores run the emulated nodes),
  with links fitted from gloo all-reduce and all-gather sweeps run inside the emulated
  cluster (experiment emulated_omb) at the experiment's uplink rate, with its ranks per node
  and nodes sending at once, and the bare link alike (perfmodel.emulated.UplinkModel), and the
  codecs timed here.

Measured profiles are cached under <results>/calibration/insitu/ (one file per cluster
placement: rate, nodes, ranks per node; one per host for codec timings) with what was run,
where and when; task=tune copies the one it used into its run dir, and task=predict reads
the cached one. An emulated profile cached before the local profile was calibrated again is
derived again from the link fits it recorded (nothing is measured): the links stay, the
cores' compute rate and overheads follow the calibration.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from neoxlab.compress import parse_spec
from neoxlab.config import Config, ConfigError
from neoxlab.config.profile import CodecProfile, LinkProfile, PerfProfile
from neoxlab.files import now
from neoxlab.layout import Layout, resolve_layout
from neoxlab.perfmodel import emulated as em
from neoxlab.perfmodel import traffic
from neoxlab.perfmodel.codec_timing import measure_codec
from neoxlab.perfmodel.predict import dim_seconds, spec_key
from neoxlab.perfmodel.resolve import check_profile, resolve_profile
from neoxlab.perfmodel.topology import crosses_nodes
from neoxlab.results.load import read_jsonl
from neoxlab.run import rundir
from neoxlab.tune.candidates import Scheme, apply

INSITU = Path("calibration") / "insitu"  # under launch.results_dir
SHAPED_FIT = "200"  # Mbit/s: the shaped fit of an unshaped experiment (UplinkModel needs one)
OMB_TIMEOUT_S = 1800
INTRA_CHECK_STEPS = 5  # steps of the uncompressed run that scales the intra-node link


@dataclass(frozen=True)
class InSitu:
    profile: PerfProfile
    origin: str  # one line: what the values are
    provenance: dict  # what was measured, where and when (empty: nothing measured)
    path: Path | None = None  # the cache file it came from or went to


def resolve(cfg: Config, measure: bool = False, specs: Iterable[str] = (),
            fresh: bool = False) -> InSitu:
    """The experiment's profile from the cache; `measure`: what the cache lacks is measured
    (emulated links: omb runs inside the emulated cluster, minutes; codecs: seconds);
    `fresh`: the emulated links are measured again even when cached. `specs`: the codecs
    to have timed besides those the experiment's scheme names."""
    results = Path(cfg.launch.results_dir)
    wanted = _specs(cfg, specs)
    if cfg.cluster.emulated is not None:
        return _emulated(cfg, results, measure, wanted, fresh)
    resolved = resolve_profile(cfg)
    if not runs_here(cfg):
        return InSitu(resolved.profile, resolved.origin, {})
    codecs, where, raw = codec_profiles(results, wanted, measure)
    if not codecs:
        return InSitu(resolved.profile, resolved.origin, {})
    profile = dataclasses.replace(resolved.profile,
                                  codecs={**resolved.profile.codecs, **codecs})
    return InSitu(profile, f"{resolved.origin}; codecs timed on this machine ({where})",
                  {"codecs": raw}, where)


def runs_here(cfg: Config) -> bool:
    """Its ranks run on this machine's kind of device (CPU ranks: local, Slurm on this
    machine, emulated nodes), so codecs timed here are the experiment's own."""
    return cfg.cluster.device == "cpu" and cfg.cluster.gpus_per_node == 0


def _specs(cfg: Config, extra: Iterable[str]) -> list[str]:
    """Codec specs to time: the scheme's own and `extra`, without `none`."""
    named = [spec_key(d.compressor, d.params) for d in cfg.compression.dims.values()]
    keys = {spec_key(*parse_spec(s)) for s in [*named, *extra]}
    return sorted(k for k in keys if parse_spec(k)[0] != "none")


# ---- codecs --------------------------------------------------------------------------

def codec_profiles(results: Path, specs: list[str], measure: bool
                   ) -> tuple[dict[str, CodecProfile], Path | None, dict]:
    """Every spec's profile, keyed as perfmodel.predict looks them up (spec_key), from this
    host's cache; the missing ones timed here when `measure`, and the cache updated."""
    path = results / INSITU / f"codecs_{socket.gethostname()}.json"
    cached = rundir.read_json(path) if path.exists() else {"codecs": {}, "raw": {}}
    if measure:
        for spec in (s for s in specs if s not in cached["codecs"]):
            profile, raw = measure_codec(spec)
            cached["codecs"][spec] = dataclasses.asdict(profile)
            cached["raw"][spec] = raw | {"host": socket.gethostname(), "created_at": now()}
        if specs:
            path.parent.mkdir(parents=True, exist_ok=True)
            rundir.write_json(path, cached)
    found = {s: CodecProfile(**cached["codecs"][s]) for s in specs if s in cached["codecs"]}
    return found, (path if found else None), {s: cached["raw"].get(s) for s in found}


# ---- the emulated cluster ------------------------------------------------------------

def placement(cfg: Config) -> tuple[str, int, int]:
    """(uplink rate or 'none', ranks per node = flows through an uplink, nodes)."""
    rate = cfg.cluster.emulated.inter.rate_mbit
    return ("none" if rate is None else f"{rate:g}", cfg.cluster.ranks_per_node,
            cfg.cluster.nodes)


def cache_path(cfg: Config) -> Path:
    rate, flows, nodes = placement(cfg)
    return (Path(cfg.launch.results_dir) / INSITU
            / f"{cfg.cluster.name}_{rate}mbit_{nodes}x{flows}.json")


def fit_points(cfg: Config) -> list[em.FitKey]:
    """The omb sweeps UplinkModel needs for this placement: one flow on 2 nodes bare and
    shaped, and the experiment's flows and nodes bare and at its rate."""
    rate, flows, nodes = placement(cfg)
    shaped = SHAPED_FIT if rate == "none" else rate
    points = [("none", 1, 2), (shaped, 1, 2), ("none", flows, nodes), (rate, flows, nodes)]
    return list(dict.fromkeys(points))


def _emulated(cfg: Config, results: Path, measure: bool, specs: list[str], fresh: bool
              ) -> InSitu:
    path = cache_path(cfg)
    base, origin = em.local_profile(results)
    if path.exists() and not fresh:
        doc = rundir.read_json(path)
        recorded = doc["provenance"].get("base_profile")
        if recorded is None or recorded == origin:
            profile = load_profile(doc, path)
            codecs, _, _ = codec_profiles(results, specs, measure)  # this host's, newer or more
            profile = dataclasses.replace(profile, codecs={**profile.codecs, **codecs})
            return with_intra_check(cfg, InSitu(profile, f"{path} ({doc['profile']['source']})",
                                                doc["provenance"], path))
        # the local profile was calibrated again since: its links, measured, stay; the cores'
        # compute rate and overheads are the new calibration's
        links = em.UplinkModel.from_dict(doc["provenance"]["links"])
        provenance = {**doc["provenance"], "base_profile": origin, "rederived_at": now()}
        return with_intra_check(cfg, _write(cfg, path, base, origin, links, results, specs,
                                            provenance))
    if not measure:
        rate, flows, nodes = placement(cfg)
        raise ConfigError(
            f"cluster '{cfg.cluster.name}' has no profile of its own, and no in-situ profile "
            f"was measured for {rate} Mbit/s uplinks, {nodes} nodes x {flows} ranks (no {path});"
            f" measure it (root, a few minutes of omb runs inside the emulated cluster): "
            f"python -m neoxlab.commands.calibrate --insitu experiment={cfg.experiment} "
            "[the same overrides], or run task=tune on it once")
    runs = omb_runs(cfg, results, measure=True)
    fits = {key: em.median_fit([em.fit_rate(em.read_omb(d), key[2]) for d in dirs])
            for key, dirs in runs.items()}
    links = em.UplinkModel.from_fits(fits)
    provenance = {"host": socket.gethostname(), "created_at": now(), "base_profile": origin,
                  "links": links.as_dict(),
                  "omb_runs": {f"{r} Mbit/s, {f} flow(s), {n} nodes": [str(d) for d in dirs]
                               for (r, f, n), dirs in runs.items()}}
    return _write(cfg, path, base, origin, links, results, specs, provenance)


def _write(cfg: Config, path: Path, base: PerfProfile, origin: str, links: em.UplinkModel,
           results: Path, specs: list[str], provenance: dict) -> InSitu:
    """The in-situ profile from the local one and the fitted links, checked and cached."""
    codecs, _, raw = codec_profiles(results, specs, measure=True)
    rate, flows, nodes = placement(cfg)
    profile = em.emulated_profile(base, links, None if rate == "none" else float(rate), flows,
                                  {**base.codecs, **codecs}, nodes)
    profile = dataclasses.replace(profile, source=(
        f"in situ: {origin} + emulated uplinks fitted from omb runs at {rate} Mbit/s, "
        f"{nodes} nodes x {flows} ranks, codecs timed on {socket.gethostname()}"))
    errors = check_profile(profile, cfg.cluster.name)
    if errors:
        raise ConfigError("the measured in-situ profile is not usable: " + "; ".join(errors))
    provenance = {**provenance, "codecs": raw}
    doc = {"profile": dataclasses.asdict(profile), "provenance": provenance}
    path.parent.mkdir(parents=True, exist_ok=True)
    rundir.write_json(path, doc)
    return InSitu(profile, f"{path} ({profile.source})", provenance, path)


# ---- the intra-node link, as the experiment's own collectives found it ----------------

def intra_dims(cfg: Config, layout: Layout) -> list[str]:
    """The dimensions whose collectives stay inside a node (and move something)."""
    moving = {m.dim for m in traffic.messages(cfg, layout)}
    return [d for d in ("tp", "pp", "dp", "zero")
            if d in moving and not crosses_nodes(layout, d, cfg.cluster.ranks_per_node)]


def intra_key(cfg: Config, layout: Layout, dims: list[str]) -> str:
    """What sets the sizes of the intra-node messages (`dims`: intra_dims): the model's shape
    and the layout."""
    m = cfg.model
    return (f"{m.name} (hidden {m.hidden_size}, seq {m.seq_length}, layers {m.num_layers}), "
            f"tp {layout.tp} pp {layout.pp} dp {layout.dp}, micro-batch {layout.micro_batch}, "
            f"grad_accum {layout.grad_accum}: {'+'.join(dims)}")


def needs_intra_check(cfg: Config, layout: Layout, found: InSitu) -> bool:
    """An emulated cluster's profile whose intra-node link this experiment has not yet
    measured with its own collectives."""
    if cfg.cluster.emulated is None or found.path is None:
        return False
    dims = intra_dims(cfg, layout)
    return bool(dims) and intra_key(cfg, layout, dims) not in found.provenance.get(
        "intra_checks", {})


def measured_dim_seconds(run_dir: Path, dims: list[str]) -> float:
    """The seconds per step the ranks of a run spent in the dimensions' collectives
    (comm.jsonl, averaged over the ranks)."""
    steps = len(read_jsonl(run_dir / "metrics.jsonl")[0])
    per_rank: dict[int, float] = {}
    for rec in read_jsonl(run_dir / "comm.jsonl")[0]:
        if rec.get("dim") in dims:
            per_rank[rec["rank"]] = per_rank.get(rec["rank"], 0.0) + rec["comm_s"]
    if not steps or not per_rank:
        raise ConfigError(f"{run_dir} has no steps or no {'/'.join(dims)} collectives in its "
                          "comm.jsonl: the intra-node link cannot be measured from it")
    return sum(per_rank.values()) / len(per_rank) / steps


def record_intra_check(cfg: Config, layout: Layout, found: InSitu, run_dir: Path) -> None:
    """An uncompressed run's seconds in the intra-node dimensions, into the profile's cache."""
    assert found.path is not None
    doc = rundir.read_json(found.path)
    checks = doc["provenance"].setdefault("intra_checks", {})
    dims = intra_dims(cfg, layout)
    checks[intra_key(cfg, layout, dims)] = {
        "measured_s": measured_dim_seconds(run_dir, dims),
        "run_dir": str(run_dir), "host": socket.gethostname(), "created_at": now()}
    rundir.write_json(found.path, doc)


def with_intra_check(cfg: Config, found: InSitu) -> InSitu:
    """The profile with its intra-node link scaled, alpha and 1/B alike, by the measured over
    the predicted seconds of the experiment's uncompressed intra-node collectives, where an
    intra check was recorded for its model and layout."""
    layout = resolve_layout(cfg)
    dims = intra_dims(cfg, layout)
    check = found.provenance.get("intra_checks", {}).get(intra_key(cfg, layout, dims))
    if check is None:
        if not dims:
            return found
        return dataclasses.replace(found, origin=(
            f"{found.origin}; intra-node link ({'+'.join(dims)}) as the omb fit, not yet "
            "checked against a run of this model and layout (task=tune runs one)"))
    none = apply(cfg, Scheme("none"))
    predicted = sum(dim_seconds(none, layout, found.profile, d, "intra")[0] for d in dims)
    scale = check["measured_s"] / predicted
    intra = scaled_link(found.profile.intra, scale)
    return dataclasses.replace(
        found, profile=dataclasses.replace(found.profile, intra=intra),
        origin=f"{found.origin}; intra-node link x{scale:.2f} in time, as the uncompressed "
               f"run {check['run_dir']} found it")


def scaled_link(link: LinkProfile, scale: float) -> LinkProfile:
    """The link `scale` times slower: every latency times it, every bandwidth over it."""
    full = None if link.full_gbs is None else link.full_gbs / scale
    p2p = None if link.p2p_latency_us is None else link.p2p_latency_us * scale
    return dataclasses.replace(link, latency_us=link.latency_us * scale,
                               bandwidth_gbs=link.bandwidth_gbs / scale, full_gbs=full,
                               p2p_latency_us=p2p)


def load_profile(doc: dict, path: Path) -> PerfProfile:
    try:
        merged = OmegaConf.merge(OmegaConf.structured(PerfProfile()), doc["profile"])
    except Exception as exc:  # noqa: BLE001 - any bad cache: measure again
        raise ConfigError(f"in-situ profile {path} does not fit the profile schema ({exc}); "
                          "delete it and measure again") from None
    return OmegaConf.to_object(merged)  # type: ignore[return-value]


def omb_runs(cfg: Config, results: Path, measure: bool, newest: int = 3
             ) -> dict[em.FitKey, list[Path]]:
    """The newest emulated_omb runs of every fit point (under `results`); `measure`: one
    more run of each first."""
    points = fit_points(cfg)
    if measure:
        for point in points:
            em.run_omb(point, results, OMB_TIMEOUT_S)
    found = em.find_omb_runs(results / "emulated_omb")
    missing = [p for p in points if p not in found]
    if missing:
        raise ConfigError(f"no emulated_omb run at (rate, flows, nodes) {missing} under "
                          f"{results / 'emulated_omb'}; measure them")
    return {p: found[p][-newest:] for p in points}


def write_into(run_dir: Path, insitu: InSitu) -> Path:
    """The profile used, with its provenance, into a run dir."""
    path = run_dir / "profile.json"
    rundir.write_json(path, {"profile": dataclasses.asdict(insitu.profile),
                             "origin": insitu.origin, "cache": str(insitu.path or ""),
                             "provenance": insitu.provenance})
    return path
