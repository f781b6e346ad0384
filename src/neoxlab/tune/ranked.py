"""The tuner's ranking for regret runs, each exported option as a compression config, so
that running them shows how far the pick is from the best one. Two exports, one at a time:
tune.export_ranked = K > 0, up to K schemes spread evenly over the predicted ranking of every
option the guard let through (the whole ranking's shape: Kendall's tau); tune.export_neighbours
= N > 0, the pick and the N options predicted next slower (the options a wrong pick most
likely displaced: the regret that matters).

The options: every candidate alone on its dimension (the others uncompressed) that passed
stage (a), every combined scheme no probe rejected, the baseline and the chosen scheme (both
always in the spread export); one per effective compression (per compressed dimension its
codec and the all-reduce algorithm the patch runs there, auto and all-gather on 2 ranks
being one; and zero.reduce_to_owner), and none whose compression a probe rejected. They go
to <run_dir>/ranked/<NN>_<slug>.yaml (NN: 01 the fastest predicted exported; the file's
`scheme:` is its stem, so a copy in configs/compression/ runs as `compression=<stem>`) and
<run_dir>/ranked.json, whose rows keep each option's predicted step and its position in the
whole ranking.
"""

from __future__ import annotations

import re
from pathlib import Path

from neoxlab.config import Config
from neoxlab.config.profile import PerfProfile
from neoxlab.files import now
from neoxlab.layout import resolve_layout
from neoxlab.perfmodel.wire_bytes import allreduce_algorithm, uplink_payload_bytes
from neoxlab.run import rundir
from neoxlab.tune.candidates import Scheme, apply
from neoxlab.tune.choose import Scored
from neoxlab.tune.report import Outcome, render_scheme

RANKED_DIR = "ranked"
SLUG_CHARS = 60  # a file stem stays readable; NN keeps stems apart


def uplink_bytes(cfg: Config, scheme: Scheme, profile: PerfProfile | None) -> float | None:
    """Predicted TCP payload per step on the emulated cluster's uplinks with the scheme;
    None off the emulated cluster (or without the profile it was predicted with)."""
    if cfg.cluster.emulated is None or profile is None:
        return None
    return uplink_payload_bytes(apply(cfg, scheme), profile)["total"]


def effective(cfg: Config, scheme: Scheme) -> tuple:
    """What the scheme changes in a run: per compressed dimension its codec and, for a
    compressed all-reduce, the algorithm the patch runs on its group (auto is all-gather
    on 2 ranks); and zero.reduce_to_owner."""
    applied = apply(cfg, scheme)
    owner, layout = applied.zero.reduce_to_owner, resolve_layout(cfg)
    groups = {"tp": layout.tp, "dp": None if owner else layout.dp}
    return tuple(sorted(
        (dim, d.compressor, tuple(sorted(d.params.items())), d.error_feedback,
         allreduce_algorithm(applied.compression.allreduce, groups[dim])
         if groups.get(dim) else None)
        for dim, d in applied.compression.dims.items() if d.compressor != "none")), owner


def probe_rejected(out: Outcome, s: Scored) -> bool:
    label = s.scheme.label
    verdict = out.scheme_verdicts.get(label)
    return label in out.probes and verdict is not None and not verdict.ok


def passed_proxy(out: Outcome, s: Scored) -> bool:
    c = s.candidate
    verdict = out.proxy_verdicts.get((c.dim, c.codec))
    return verdict is not None and verdict.ok


def guard_passing(cfg: Config, out: Outcome) -> list[Scored]:
    """Every predicted option the guard let through, one per effective compression,
    fastest predicted first."""
    rejected = {effective(cfg, s.scheme) for s in out.schemes if probe_rejected(out, s)}
    passing = [s for s in out.schemes if not probe_rejected(out, s)]
    passing += [s for s in out.candidates if passed_proxy(out, s)]
    kept: dict[tuple, Scored] = {}
    for s in [out.base, out.chosen, *passing]:
        key = effective(cfg, s.scheme)
        if s.prediction is None or (key in rejected and s is not out.base
                                    and s is not out.chosen):
            continue
        kept.setdefault(key, s)
    return sorted(kept.values(), key=lambda s: s.step_s)


def spread(n: int, k: int, keep: set[int]) -> list[int]:
    """k of the positions 0..n-1 evenly spaced, each of `keep` in place of the nearest
    picked one not in `keep` (all of `keep` even where it holds more than k)."""
    if k >= n:
        return list(range(n))
    picked = ({int(j * (n - 1) / (k - 1) + 0.5) for j in range(k)} if k > 1 else
              {(n - 1) // 2})
    for i in sorted(keep - picked):
        free = [p for p in picked if p not in keep]
        if free:
            picked.remove(min(free, key=lambda p: abs(p - i)))
        picked.add(i)
    return sorted(picked)


def slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")[:SLUG_CHARS].rstrip("_")


def neighbours(n: int, at: int, k: int) -> list[int]:
    """The positions of the pick (at) and of the k options after it among n ranked ones
    (fewer where the ranking ends first)."""
    return list(range(at, min(n, at + k + 1)))


def exported(cfg: Config, out: Outcome) -> list[tuple[int, Scored]]:
    """The options tune.export_ranked or tune.export_neighbours asks for, with their
    positions in the ranking of every guard-passing option (0: the fastest predicted)."""
    options = guard_passing(cfg, out)
    keys = [effective(cfg, s.scheme) for s in options]
    if cfg.tune.export_neighbours > 0:
        at = keys.index(effective(cfg, out.chosen.scheme))
        positions = neighbours(len(options), at, cfg.tune.export_neighbours)
    else:
        keep = {i for i, key in enumerate(keys)
                if key in (effective(cfg, out.base.scheme), effective(cfg, out.chosen.scheme))}
        positions = spread(len(options), cfg.tune.export_ranked, keep)
    return [(i, options[i]) for i in positions]


def export_ranked(cfg: Config, out: Outcome, run_dir: Path) -> list[dict]:
    """Write the exported configs and ranked.json (its rows returned); nothing when
    tune.export_ranked and tune.export_neighbours are 0."""
    if cfg.tune.export_ranked <= 0 and cfg.tune.export_neighbours <= 0:
        return []
    chosen = exported(cfg, out)
    (run_dir / RANKED_DIR).mkdir(parents=True, exist_ok=True)
    rows = []
    for rank, (position, s) in enumerate(chosen, 1):
        name = f"{rank:02d}_{slug(s.scheme.label)}"
        row = ranked_row(cfg, out, s, name, position + 1)
        header = ranked_header(cfg, out, row, rank, len(chosen), run_dir)
        rundir.write_atomic(run_dir / RANKED_DIR / f"{name}.yaml",
                            render_scheme(cfg, s.scheme, name, header))
        rows.append(row)
    rundir.write_json(run_dir / "ranked.json", rows)
    return rows


def ranked_row(cfg: Config, out: Outcome, s: Scored, name: str, position: int) -> dict:
    key = effective(cfg, s.scheme)
    row = {"name": name, "label": s.scheme.label, "position": position,
           "predicted_step_s": s.step_s,
           "predicted_samples_per_s": s.prediction.samples_per_s,
           "chosen": key == effective(cfg, out.chosen.scheme),
           "baseline": key == effective(cfg, out.base.scheme)}
    uplink = uplink_bytes(cfg, s.scheme, out.profile)
    if uplink is not None:
        row["uplink_payload_bytes_per_step"] = uplink
    return row


def ranked_header(cfg: Config, out: Outcome, row: dict, rank: int, total: int,
                  run_dir: Path) -> list[str]:
    base = out.base.step_s
    roles = [r for r in ("chosen", "baseline") if row[r]]
    name = row["name"]
    return [f"Exported {rank} of {total} (fastest predicted first; position "
            f"{row['position']} among the guard-passing options) by task=tune for experiment "
            f"{cfg.experiment} ({now()}; {run_dir}).",
            f"{row['label']}: predicted step {row['predicted_step_s']:.4g} s against "
            f"{base:.4g} s uncompressed ({(base / row['predicted_step_s'] - 1) * 100:+.1f} % "
            f"samples/s)" + "".join(f"; the {r}" for r in roles) + ".",
            f"Run: copy to configs/compression/{name}.yaml, then make run "
            f"EXP={cfg.experiment} task=train compression={name}"]
