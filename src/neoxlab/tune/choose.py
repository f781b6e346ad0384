"""Predicted step times of the candidates and of the schemes made of them, and the margin a
compressed dimension must clear.

Each candidate is predicted alone (its dimension set, every other one uncompressed) against
the uncompressed baseline. The model errs by up to `margin` of what it predicts, and a
choice trades three of its terms: the dimension's communication before, after, and the
codec time it adds. So a candidate is kept only when

    saving = step(baseline) - step(candidate) > margin x (comm before + comm after + codec)

(the terms as the prediction's breakdown has them). The kept candidates of each dimension
(the fastest `tune.top_per_dim`, plus uncompressed) that also pass the loss guard's proxy
are combined into schemes, each predicted whole and held to the same margin over the
terms of all its dimensions.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from omegaconf import OmegaConf

from neoxlab.config import CompressionConfig, Config, ConfigError
from neoxlab.config.compose import CONFIG_DIR
from neoxlab.config.profile import PerfProfile
from neoxlab.perfmodel.predict import Prediction, predict, spec_key
from neoxlab.tune.candidates import Candidate, Scheme, apply, scheme_errors

COMM = ("tp", "pp", "dp", "zero")


@dataclass
class Scored:
    """A candidate, or a scheme, with its prediction and the margin's verdict."""

    scheme: Scheme
    prediction: Prediction | None = None
    saving_s: float = 0.0  # step(baseline) - step(this)
    traded_s: float = 0.0  # comm before + comm after + codec of the dimensions it sets
    margin: float = 0.0
    note: str = ""  # why it was not predicted (rules, no codec profile), or ""

    @property
    def candidate(self) -> Candidate | None:
        """The one candidate of a candidate's own scheme (None for a scheme of several)."""
        parts = list(self.scheme.parts.values())
        return parts[0] if len(parts) == 1 else None

    @property
    def step_s(self) -> float | None:
        return None if self.prediction is None else self.prediction.step_s

    @property
    def threshold_s(self) -> float:
        return self.margin * self.traded_s

    @property
    def clears_margin(self) -> bool:
        return self.prediction is not None and self.saving_s > self.threshold_s


BASELINE = "none"


def predict_scheme(cfg: Config, scheme: Scheme, profile: PerfProfile, origin: str,
                   base: Prediction | None, margin: float) -> Scored:
    """One scheme predicted, and what it trades against the baseline."""
    errors = scheme_errors(cfg, scheme)
    if errors:
        return Scored(scheme, note="; ".join(errors), margin=margin)
    try:
        pred = predict(apply(cfg, scheme), profile, origin)
    except ConfigError as exc:
        return Scored(scheme, note=str(exc), margin=margin)
    if base is None:
        return Scored(scheme, pred, margin=margin)
    dims = {c.dim for c in scheme.parts.values()}
    if scheme.reduce_to_owner is not None:
        dims.add("dp")
    comm = sum(base.breakdown[d] + pred.breakdown[d] for d in dims & set(COMM))
    codec = max(pred.breakdown["codec"] - base.breakdown["codec"], 0.0)
    return Scored(scheme, pred, base.step_s - pred.step_s, comm + codec, margin=margin)


def score_candidates(cfg: Config, candidates: list[Candidate], profile: PerfProfile,
                     origin: str) -> tuple[Scored, list[Scored]]:
    """The baseline's prediction and every candidate's, each alone on its dimension."""
    margin = cfg.tune.margin
    base = predict_scheme(cfg, Scheme(BASELINE), profile, origin, None, margin)
    if base.prediction is None:
        raise ConfigError(f"the uncompressed baseline cannot be predicted: {base.note}")
    scored = [predict_scheme(cfg, Scheme(f"{c.dim} {c.label}", {c.dim: c}), profile, origin,
                             base.prediction, margin) for c in candidates]
    return base, scored


def eligible(scored: list[Scored], passes: Callable[[Candidate], bool], dim: str, top: int
             ) -> list[Candidate]:
    """A dimension's candidates for the schemes: uncompressed (the experiment's own
    setting) and the fastest option of each of the `top` fastest codecs that clear the
    margin and pass the guard's proxy."""
    mine = [s for s in scored if s.prediction is not None and s.candidate.dim == dim]
    plain = [s.candidate for s in mine
             if not s.candidate.compressed and not s.candidate.reduce_to_owner]
    best: dict[tuple[str, bool | None], Candidate] = {}  # the fastest option of each codec
    for s in sorted((s for s in mine if s.clears_margin and passes(s.candidate)),
                    key=lambda s: s.step_s):  # ties keep the first enumerated (allreduce auto)
        best.setdefault((s.candidate.codec, s.candidate.reduce_to_owner), s.candidate)
    return list(dict.fromkeys(plain[:1] + list(best.values())[:top]))


def combine(cfg: Config, scored: list[Scored], passes: Callable[[Candidate], bool],
            profile: PerfProfile, origin: str, base: Scored) -> list[Scored]:
    """Every consistent scheme made of the dimensions' eligible candidates, predicted whole,
    fastest first (the baseline among them)."""
    dims = sorted({s.candidate.dim for s in scored})
    choices = [eligible(scored, passes, d, cfg.tune.top_per_dim) for d in dims]
    out: dict[str, Scored] = {}
    for combo in itertools.product(*[c or [None] for c in choices]):
        parts = {c.dim: c for c in combo
                 if c is not None and (c.compressed or c.reduce_to_owner)}
        scheme = Scheme(f"tuned_{cfg.experiment}" if parts else BASELINE, parts)
        if not scheme.consistent() or scheme.label in out:
            continue
        out[scheme.label] = base if not parts else predict_scheme(
            cfg, scheme, profile, origin, base.prediction, cfg.tune.margin)
    return sorted((s for s in out.values() if s.prediction is not None),
                  key=lambda s: s.step_s)


def fixed_specs(names: list[str]) -> list[str]:
    """The codec specs the fixed schemes of configs/compression/ use, so that the in-situ
    profile times them too (a fixed int4 is predicted even where int4 is no candidate)."""
    out: list[str] = []
    for name in names:
        try:
            dims = OmegaConf.to_container(OmegaConf.load(
                CONFIG_DIR / "compression" / f"{name}.yaml")).get("dims") or {}
        except (OSError, ValueError):
            continue  # predict_fixed reports it
        out += [spec_key(d["compressor"], d.get("params") or {}) for d in dims.values()
                if d.get("compressor", "none") != "none"]
    return list(dict.fromkeys(out))


def predict_fixed(cfg: Config, names: list[str], profile: PerfProfile, origin: str
                  ) -> dict[str, Prediction | str]:
    """The fixed schemes of configs/compression/ on this experiment (the error text for
    one that cannot be predicted), for the pick's gain over each."""
    out: dict[str, Prediction | str] = {}
    for name in names:
        path = CONFIG_DIR / "compression" / f"{name}.yaml"
        try:
            loaded = OmegaConf.merge(OmegaConf.structured(CompressionConfig),
                                     OmegaConf.load(path))
            fixed = copy.deepcopy(cfg)
            fixed.compression = OmegaConf.to_object(loaded)
            out[name] = predict(fixed, profile, origin)
        except (OSError, ValueError, ConfigError) as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    return out
