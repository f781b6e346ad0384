"""task=tune: the tuner's run hook (tasks/__init__.py) and its rules.

    make run EXP=<experiment> task=tune [overrides]

A run dir under <results>/tune/<exp>/ holds the frozen config, the profile used
(profile.json), every real run it made (runs/), tune.json, the chosen scheme's YAML and,
with tune.export_ranked or tune.export_neighbours, ranked/ and ranked.json (tune/ranked.py);
the table goes to <results>/tables/<exp>.tune.* and the figure to
<results>/figures/<exp>.tune.*. launch.submit=false plans the run dir and stops there.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from neoxlab.comm import capture
from neoxlab.compress import make_compressor
from neoxlab.config import Config, ConfigError
from neoxlab.engines.registry import engine_of
from neoxlab.layout import Layout, resolve_layout
from neoxlab.perfmodel.wire import accounted_between_nodes, payload_bytes
from neoxlab.results import figures
from neoxlab.run import rundir
from neoxlab.tune import guard, insitu, proxy
from neoxlab.tune.candidates import (
    Scheme,
    active_dims,
    dim_dtype,
    enumerate_candidates,
    overrides,
    tune_codecs,
    without_scheme,
)
from neoxlab.tune.choose import Scored, combine, fixed_specs, predict_fixed, score_candidates
from neoxlab.tune.guard import Verdict
from neoxlab.tune.probe import Budget, Run, Runner, estimate_s
from neoxlab.tune.ranked import export_ranked, uplink_bytes
from neoxlab.tune.report import Outcome, table, write_config, write_tables

TUNE_DIR = "tune"  # under launch.results_dir (the task record's output_dir): not an experiment
OWN_KEYS = ("experiment=", "task=", "launch.results_dir=", "launch.submit=")


def rules(cfg: Config, world: int) -> list[str]:
    """What a tune needs before anything starts."""
    t, errors = cfg.tune, []
    if cfg.runs:
        errors.append("task=tune tunes one experiment, not a comparison (runs: [...]); name "
                      "one of its members")
    unknown = sorted(set(t.dims) - {"tp", "pp", "dp", "zero"})
    if unknown:
        errors.append(f"tune.dims has {unknown}; compressible dimensions are tp, pp, dp, zero "
                      "(control traffic is never compressed)")
    for spec in tune_codecs(cfg):
        try:
            make_compressor(spec)
        except ValueError as exc:
            errors.append(f"tune.codecs: {exc}")
    bad = sorted(set(t.allreduce) - {"auto", "alltoall", "allgather"})
    if bad:
        errors.append(f"tune.allreduce has {bad}; use auto, alltoall or allgather")
    if not 0.0 <= t.margin < 1.0:
        errors.append(f"tune.margin={t.margin} is a fraction of the traded terms; use [0, 1)")
    if not 0.0 < t.probe_share <= 1.0:
        errors.append(f"tune.probe_share={t.probe_share} is a share of the guarded run; use "
                      "(0, 1]")
    if t.export_ranked < 0 or t.export_ranked == 1:
        errors.append(f"tune.export_ranked={t.export_ranked}: 0 (off) or >= 2 (the baseline "
                      "and the chosen scheme are always exported)")
    if t.export_neighbours < 0:
        errors.append(f"tune.export_neighbours={t.export_neighbours}: 0 (off) or >= 1 (the "
                      "pick and that many options predicted next slower); use e.g. 3")
    if t.export_ranked > 0 and t.export_neighbours > 0:
        errors.append(f"tune.export_ranked={t.export_ranked} and tune.export_neighbours="
                      f"{t.export_neighbours}: one export at a time (both write <run dir>/"
                      "ranked/); set one of them to 0")
    if t.budget_reference:
        try:
            make_compressor(t.budget_reference)
        except ValueError as exc:
            errors.append(f"tune.budget_reference={t.budget_reference!r}: {exc}; name naive's "
                          "codec (zfp:rate=8) or '' for the map's budgets alone")
    if any(not b > 0 for b in t.error_budget.values()):
        errors.append(f"tune.error_budget={dict(t.error_budget)}: every budget must be > 0")
    if t.measure:
        if not engine_of(cfg).checkpoints:
            errors.append("tune.measure=true with this engine: the capture and "
                          "probe runs need the builtin engine's checkpoints and capture; use "
                          "engine=builtin or tune.measure=false (predicted only)")
        if t.warmup_steps < 1 or t.probe_steps < 2:
            errors.append(f"tune.warmup_steps={t.warmup_steps} and tune.probe_steps="
                          f"{t.probe_steps}: need >= 1 and >= 2")
        if cfg.cluster.scheduler != "local" and cfg.cluster.emulated is None:
            errors.append(f"tune.measure=true on cluster '{cfg.cluster.name}' "
                          f"({cfg.cluster.scheduler}): its runs start on this machine; run "
                          "the tuner on the cluster, or tune.measure=false (predicted only)")
    return errors


def run_tune(cfg: Config, configs: list[Config], argv: list[str]) -> int:
    """Tune the (checked) experiment; the outputs' paths are printed."""
    layout = resolve_layout(cfg)
    results = Path(cfg.launch.results_dir)
    run_dir = rundir.freeze(cfg, layout, argv, root=results / TUNE_DIR)
    print(f"[neoxlab] tune run dir: {run_dir}", flush=True)
    if not cfg.launch.submit:
        print("[neoxlab] launch.submit=false: validated and planned, nothing measured",
              flush=True)
        return 0
    rundir.set_status(run_dir, rundir.State.RUNNING)
    start = time.perf_counter()
    try:
        out = tune(cfg, layout, run_dir, user_overrides(argv))
    except (ConfigError, RuntimeError) as exc:
        rundir.set_status(run_dir, rundir.State.FAILED, error=str(exc))
        raise ConfigError(str(exc)) from None
    out.cost_s["total"] = time.perf_counter() - start
    paths = write_tables(table(cfg, out), out, results / "tables")
    config = write_config(cfg, out, run_dir)
    ranked = export_ranked(cfg, out, run_dir)
    rundir.write_json(run_dir / "tune.json", summary(cfg, out, config, len(ranked)))
    rundir.set_status(run_dir, rundir.State.COMPLETED)
    print(paths[2].read_text(), flush=True)
    print(f"[neoxlab] chosen scheme: {config} (make run EXP={cfg.experiment} task=train "
          f"compression={config.stem})", flush=True)
    if ranked:
        print(f"[neoxlab] ranked for regret runs: {len(ranked)} schemes in "
              f"{run_dir / 'ranked'} (ranked.json)", flush=True)
    print(f"[neoxlab] table: {paths[0].with_suffix('')}.{{parquet,csv,md}}; tuner wall time "
          f"{out.cost_s['total']:.1f} s", flush=True)
    return figures.draw_one("tune.py", cfg.experiment, results)


def summary(cfg: Config, out: Outcome, config: Path, ranked: int) -> dict:
    """tune.json: the pick, its config, the tuner's cost and notes, the predictions."""
    return {
        "chosen": out.chosen.scheme.label, "config": str(config), "cost_s": out.cost_s,
        "notes": out.notes, "profile": out.profile_origin, "proxy_tensors": out.proxy_source,
        "baseline_step_s": out.base.step_s, "chosen_step_s": out.chosen.step_s,
        # the emulated cluster only (else null): the TCP payload its uplinks should carry
        "chosen_uplink_payload_bytes_per_step": uplink_bytes(cfg, out.chosen.scheme,
                                                             out.profile),
        "baseline_uplink_payload_bytes_per_step": uplink_bytes(cfg, out.base.scheme,
                                                               out.profile),
        "ranked": ranked,  # schemes in <run_dir>/ranked.json (export_ranked, export_neighbours)
        # stage (b)'s probes in the order run (runs/probe<k>): deviation, threshold, verdict
        "probes": [{"run": f"probe{k}", "label": label, "deviation": dev, "threshold": thr,
                    "ok": out.scheme_verdicts[label].ok,
                    "reason": out.scheme_verdicts[label].reason}
                   for k, (label, (dev, thr)) in enumerate(out.probes.items(), start=1)],
    }


def user_overrides(argv: list[str]) -> list[str]:
    """The command line's overrides, for the tuner's own runs of the experiment."""
    args = argv[3:] if argv[:3] == ["python", "-m", "neoxlab"] else argv
    return without_scheme([a for a in args if not a.startswith(OWN_KEYS)
                           and not a.startswith("tune.")])


def tune(cfg: Config, layout: Layout, run_dir: Path, user: list[str]) -> Outcome:
    t, cost, notes = cfg.tune, {}, []
    clock = time.perf_counter()
    measure = t.measure
    runner = Runner(cfg.experiment, user, run_dir, t.run_timeout_s)
    codecs = tune_codecs(cfg)
    say(f"profile: {'measured here (codecs timed unless cached)' if measure else 'predicted only'}"
        f"; {len(codecs)} codecs"
        + ("; emulated links fitted from omb runs inside the emulated cluster unless cached "
           "(minutes)" if cfg.cluster.emulated is not None else ""))
    timed = [*codecs, *fixed_specs(t.compare)]
    found = insitu.resolve(cfg, measure=measure or insitu.runs_here(cfg), specs=timed)
    if insitu.needs_intra_check(cfg, layout, found):
        say(f"profile: intra-node link check, {insitu.INTRA_CHECK_STEPS} uncompressed steps")
        found = _intra_check(cfg, layout, runner, found, timed)
    insitu.write_into(run_dir, found)
    cost["profile"], clock = _lap(clock)
    candidates, excluded = enumerate_candidates(cfg, layout)
    base, scored = score_candidates(cfg, candidates, found.profile, found.origin)
    fixed = predict_fixed(cfg, t.compare, found.profile, found.origin)
    cost["predict"], clock = _lap(clock)
    say(f"profile {cost['profile']:.0f} s ({found.origin}); predicted {len(scored)} candidates "
        f"({len(excluded)} left out); uncompressed step {base.step_s:.3g} s")

    baseline: Run | None = None
    if measure:  # stage (a): the baseline run captures every dimension's first messages
        say(f"stage (a): baseline run, {t.warmup_steps + t.probe_steps} uncompressed steps, "
            f"capture and the shared checkpoint at step {t.warmup_steps}")
        baseline = runner.train("baseline", _baseline_args(cfg))
        cost["baseline_run"], clock = _lap(clock)
        say(f"stage (a): baseline run done in {baseline.wall_s:.0f} s (median step "
            f"{baseline.step_s:.3g} s)")
        problems = _run_problems(cfg, layout, baseline, Scheme("none"))
        if baseline.error or problems:
            why = "; ".join([baseline.error, *problems] if baseline.error else problems)
            raise RuntimeError(f"the tuner's baseline run failed: {why}")
        tensors = capture.load(baseline.run_dir)
        source = f"captured from the baseline run's own collectives ({baseline.run_dir})"
    else:
        tensors = proxy.stand_ins(cfg, {d: dim_dtype(cfg, d) for d, idle
                                        in active_dims(cfg, layout).items() if idle is None})
        source = ("seeded stand-ins, Gaussian for activations and gradients, parameter-like "
                  "(the model's init) for ZeRO's all-gathers (tune.measure=false: no capture "
                  "on this cluster)")
    reference = t.budget_reference
    specs = sorted({c.codec for c in candidates} | ({reference} if reference else set()))
    errors = proxy.errors(specs, {d: tensors.get(d, []) for d in {c.dim for c in candidates}})
    limits, verdicts = guard.stage_a([(c.dim, c.codec) for c in candidates], errors,
                                     t.error_budget, reference)
    notes += [f"{d}'s budget is {limits[d]:.3g}, not the map's {t.error_budget[d]:.3g}: naive's "
              f"{reference} errs that much on these tensors" for d in sorted(limits)
              if d in t.error_budget and limits[d] > t.error_budget[d]]
    cost["proxy"], clock = _lap(clock)
    passed = sum(v.ok for v in verdicts.values())
    say(f"stage (a): {passed} of {len(verdicts)} (dimension, codec) options within the budgets "
        + ", ".join(f"{d} {limits[d]:.3g}" for d in sorted(limits) if d in
                    {c.dim for c in candidates}))

    schemes = combine(cfg, scored, lambda c: verdicts[(c.dim, c.codec)].ok, found.profile,
                      found.origin, base)
    finalists = [s for s in schemes if s.scheme.parts and s.clears_margin][:t.finalists]
    say(f"schemes: {len(schemes)} predicted, {len(finalists)} finalist(s)"
        + "".join(f"; {s.scheme.label} ({s.step_s:.3g} s)" for s in finalists))
    scheme_verdicts: dict[str, Verdict] = {}
    probes: dict[str, tuple[float, float]] = {}
    chosen = base
    if finalists and baseline is not None:
        chosen = _stage_b(cfg, layout, runner, baseline, base, finalists, scheme_verdicts,
                          probes, notes, cost)
    elif finalists:
        chosen = finalists[0]
        scheme_verdicts[chosen.scheme.label] = Verdict(
            True, "stage (a) only: predicted-only tune (tune.measure=false), no probe run")
    if chosen is base:
        notes.append("no scheme clears the margin and the guard: the baseline stays")
    say(f"chosen: {chosen.scheme.label}")
    return Outcome(cfg.experiment, base, scored, excluded, errors, verdicts, source, schemes,
                   scheme_verdicts, probes, chosen, cost, fixed, notes, found.origin,
                   found.profile, limits)


def _intra_check(cfg: Config, layout: Layout, runner: Runner, found: insitu.InSitu,
                 timed: list[str]) -> insitu.InSitu:
    """A short uncompressed run of the experiment, whose seconds in its collectives inside a
    node scale the profile's intra-node link (recorded in the profile's cache)."""
    run = runner.train("intra_link", [*overrides(cfg, Scheme("none")),
                                      f"train.steps={insitu.INTRA_CHECK_STEPS}"])
    if run.error or run.run_dir is None:
        raise RuntimeError(f"the tuner's intra-node link run failed: {run.error or 'no run dir'}")
    insitu.record_intra_check(cfg, layout, found, run.run_dir)
    return insitu.resolve(cfg, measure=True, specs=timed)


def _lap(clock: float) -> tuple[float, float]:
    now = time.perf_counter()
    return now - clock, now


def _baseline_args(cfg: Config) -> list[str]:
    """Uncompressed, warm-up + probe steps, the shared checkpoint after the warm-up, the
    first messages of every dimension captured."""
    t = cfg.tune
    steps = t.warmup_steps + t.probe_steps
    return [*overrides(cfg, Scheme("none")), f"train.steps={steps}",
            f"train.checkpoint_every={t.warmup_steps}",
            f"train.keep_checkpoints={steps // t.warmup_steps + 1}",
            f"tune.capture_tensors={max(1, t.capture_tensors or 4)}",
            f"train.metrics_warmup_steps={min(cfg.train.metrics_warmup_steps, steps - 1)}"]


def _stage_b(cfg: Config, layout: Layout, runner: Runner, baseline: Run, base: Scored,
             finalists: list[Scored], verdicts: dict[str, Verdict],
             probes: dict[str, tuple[float, float]], notes: list[str], cost: dict
             ) -> Scored:
    """Noise runs, then the finalists fastest first, within the cap; the first that passes.

    Noise runs and probes all start from the baseline's shared checkpoint and train the
    same steps: a noise run uncompressed with another data order (data.seed), a probe with
    its scheme on the baseline's data. So the threshold is the loss spread a probe could
    show without compression, not the spread of another initialisation. With
    tune.always_probe the first noise run and the first finalist's probe run even over the
    cap (said in a line and the notes); otherwise stage (b) may not run at all, also said."""
    t = cfg.tune
    steps = t.warmup_steps + t.probe_steps
    window = list(range(t.warmup_steps + 1, steps + 1))
    ratio = {s.scheme.label: s.step_s / base.step_s for s in finalists}
    guarded = cfg.train.steps * baseline.step_s * ratio[finalists[0].scheme.label]
    budget = Budget(t.probe_share * guarded)
    cap = (f"probe cap {budget.cap_s:.0f} s = {t.probe_share:.0%} of the guarded run's "
           f"{guarded:.0f} s (train.steps={cfg.train.steps}, estimated)")
    say(f"stage (b): {cap}; {t.noise_seeds} noise run(s) and up to {len(finalists)} "
        f"probe(s) of {t.probe_steps} steps from the shared checkpoint (step "
        f"{t.warmup_steps})")
    checkpoint = baseline.run_dir / "checkpoints" / f"step{t.warmup_steps}"
    over: list[str] = []
    noise_runs = []
    for i in range(1, t.noise_seeds + 1):
        if not _fits(budget, estimate_s(baseline, t.probe_steps, 1.0),
                     t.always_probe and i == 1, f"noise run {i}", over):
            break
        seed = cfg.data.seed + i
        say(f"stage (b): noise run {i}/{t.noise_seeds}: uncompressed, data.seed={seed}")
        run = runner.from_checkpoint(f"noise_data{seed}", checkpoint,
                                     [*overrides(cfg, Scheme("none")), f"train.steps={steps}",
                                      f"data.seed={seed}"])
        budget.spend(run.wall_s)
        problems = [run.error] if run.error else guard.sanity(run.records)
        gap = guard.deviation(run.losses, baseline.losses, window)
        say(f"stage (b): noise run {i} done in {run.wall_s:.0f} s: "
            + (f"failed ({'; '.join(problems)}), not used" if problems else
               f"mean gap {gap:.3g} to the baseline over steps {window[0]}-{window[-1]}"))
        if not problems:
            noise_runs.append(run)
    cost["noise_runs"] = budget.spent_s
    threshold = guard.noise_threshold(baseline.losses, [r.losses for r in noise_runs], window,
                                      t.noise_factor)
    if not noise_runs:
        why = (f"stage (b) not run: {over[0]}" if over else
               "stage (b) not run: no noise run finished")
        notes.append(f"{why}; chosen on stage (a) alone")
        say(f"{why}; chosen on stage (a) alone")
        chosen = finalists[0]
        verdicts[chosen.scheme.label] = Verdict(True, f"stage (a) only: {why}")
        return chosen
    say(f"stage (b): threshold {threshold:.3g} = tune.noise_factor {t.noise_factor} x the "
        "largest noise gap")
    chosen = base
    for k, s in enumerate(finalists):
        label = s.scheme.label
        if not _fits(budget, estimate_s(baseline, t.probe_steps, ratio[label]),
                     t.always_probe and not probes, f"probe of {label}", over):
            verdicts[label] = Verdict(False, f"not probed: over the cap ({budget.cap_s:.0f} s)")
            continue
        name = f"probe{len(probes) + 1}"
        say(f"stage (b): probe {k + 1}/{len(finalists)}: {label} (predicted step "
            f"{s.step_s:.3g} s against {base.step_s:.3g} s uncompressed)")
        run = runner.from_checkpoint(name, checkpoint, [*overrides(cfg, s.scheme),
                                                        f"train.steps={steps}"])
        budget.spend(run.wall_s)
        problems = ([run.error] if run.error else []) + _run_problems(cfg, layout, run,
                                                                      s.scheme)
        verdict, dev = guard.probe_verdict(run.losses, baseline.losses, window, threshold)
        probes[label] = (dev, threshold)
        if problems:
            verdict = Verdict(False, "silent failure: " + "; ".join(problems))
        verdicts[label] = verdict
        say(f"stage (b): probe {k + 1} done in {run.wall_s:.0f} s: "
            f"{'pass' if verdict.ok else 'REJECTED'}: {verdict.reason}")
        if verdict.ok:
            chosen = s
            break
    cost["probes"] = budget.spent_s - cost["noise_runs"]
    notes.append(f"{cap}; noise runs and probes spent {budget.spent_s:.0f} s")
    notes += over
    return chosen


def _fits(budget: Budget, estimate: float, anyway: bool, what: str, over: list[str]) -> bool:
    """Whether a run fits the cap; one that does not but runs anyway (tune.always_probe) or
    is left out is said in a line and kept for the notes."""
    if budget.fits(estimate):
        return True
    left = max(budget.cap_s - budget.spent_s, 0.0)
    line = (f"{what} (about {estimate:.0f} s) is over the probe cap ({left:.0f} of "
            f"{budget.cap_s:.0f} s left)")
    line += ("; run anyway (tune.always_probe: stage (b) runs at least one noise run and one "
             "probe)" if anyway else "; not run (raise tune.probe_share or train.steps)")
    over.append(line)
    say(f"stage (b): {line}")
    return anyway


def say(text: str) -> None:
    """One progress line of the tuner (the project's plain-line convention, run/progress.py:
    `[neoxlab] <what>: ...`), so a tune of many minutes shows each stage and run."""
    print(f"[neoxlab] tune: {text}", flush=True)


def _run_problems(cfg: Config, layout: Layout, run: Run, scheme: Scheme) -> list[str]:
    """Silent failures of one run: its metrics, its bytes on the wire, its uplinks."""
    if run.run_dir is None:
        return ["no run dir"]
    problems = guard.sanity(run.records)
    active = [d for d, idle in active_dims(cfg, layout).items() if idle is None]
    meant = {}
    for dim in active:
        part = scheme.parts.get(dim)
        shrinks = part is not None and part.compressed and make_compressor(
            part.codec).shrinks(dim_dtype(cfg, dim)) is not False
        meant[dim] = shrinks
    problems += guard.wire_problems(run.comm_totals(), meant)
    network = run.run_dir / "network.json"
    if network.exists():  # the emulated cluster: what its uplinks carried
        groups = run.run_dir / "comm_groups.jsonl"
        rows = [json.loads(line) for line in groups.read_text().splitlines() if line]
        per_node = cfg.cluster.ranks_per_node
        accounted = accounted_between_nodes(rows, lambda r: r // per_node)
        uplinks = rundir.read_json(network)["uplinks"]
        carried = sum(payload_bytes(c, "tx") for c in uplinks.values())
        problems += guard.uplink_problems(carried, accounted)
    return problems
