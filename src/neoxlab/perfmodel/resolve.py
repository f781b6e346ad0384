"""The profile a prediction uses: the cluster's YAML profile, replaced by its calibration JSON
when one exists; checked, so that a prediction never divides by a missing bandwidth."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from neoxlab.config import Config, ConfigError
from neoxlab.config.profile import LIBRARY_DTYPES, LIBRARY_OPS, MARKS, PerfProfile


@dataclass(frozen=True)
class Resolved:
    profile: PerfProfile
    origin: str  # what the values are: the YAML profile, or the calibration file


def calibration_path(cfg: Config) -> Path | None:
    p = cfg.cluster.profile
    if p is None or not p.calibration:
        return None
    return Path(cfg.launch.results_dir) / p.calibration


def resolve_profile(cfg: Config) -> Resolved:
    """The checked profile of cfg's cluster; ConfigError when there is none or it is bad."""
    base = cfg.cluster.profile
    name = cfg.cluster.name
    if base is None:
        raise ConfigError(
            f"cluster '{name}' has no hardware profile (cluster.profile is null); task=predict "
            f"needs one: add a `profile:` block to configs/cluster/{name}.yaml (every value "
            "with its source, see configs/cluster/lassen.yaml) or pick a cluster that has one"
        )
    origin = f"configs/cluster/{name}.yaml profile ({base.source})"
    profile = base
    path = calibration_path(cfg)
    if path is not None and path.exists():
        profile = merge_calibration(base, path)
        origin = f"{path} ({profile.source})"
    elif path is not None:
        origin += (f"; calibration {path} not found, so the YAML values are used "
                   "(make it with `python -m neoxlab.commands.calibrate`)")
    errors = check_profile(profile, name)
    if errors:
        raise ConfigError(f"cluster '{name}' profile is not usable for task=predict:\n"
                          + "\n".join(f"  - {e}" for e in errors))
    return Resolved(profile, origin)


def merge_calibration(base: PerfProfile, path: Path) -> PerfProfile:
    """Calibrated values (the JSON's `profile` object) replace the YAML ones."""
    try:
        data = json.loads(path.read_text())
        merged = OmegaConf.merge(OmegaConf.structured(base), data["profile"])
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"calibration file {path} is unreadable ({exc}); rerun "
                          "`python -m neoxlab.commands.calibrate` or delete it") from None
    except (ConfigKeyError, ValidationError) as exc:
        raise ConfigError(f"calibration file {path} does not fit the profile schema ({exc}); "
                          "rerun `python -m neoxlab.commands.calibrate`") from None
    return OmegaConf.to_object(merged)  # type: ignore[return-value]


def check_profile(p: PerfProfile, cluster: str) -> list[str]:
    where = f"cluster.profile ({cluster})"
    errors = []
    if p.achievable_tflops <= 0:
        errors.append(f"{where}.achievable_tflops={p.achievable_tflops} must be > 0; give the "
                      "dense rate one device reaches")
    for link in ("intra", "inter"):
        lp = getattr(p, link)
        if lp.bandwidth_gbs <= 0 or lp.latency_us < 0:
            errors.append(f"{where}.{link}: bandwidth_gbs={lp.bandwidth_gbs} must be > 0 and "
                          f"latency_us={lp.latency_us} >= 0")
    for name, c in p.codecs.items():
        if c.encode_gbs <= 0 or c.decode_gbs <= 0 or c.call_us < 0:
            errors.append(f"{where}.codecs.{name}: encode_gbs/decode_gbs must be > 0 and "
                          "call_us >= 0")
        if c.ratio is not None and c.ratio <= 0:
            errors.append(f"{where}.codecs.{name}.ratio={c.ratio} must be > 0 or null")
    for key in ("dp_overlap", "zero_overlap"):
        value = getattr(p, key)
        if not 0.0 <= value <= 1.0:
            errors.append(f"{where}.{key}={value} is a fraction; use a value in [0, 1]")
    for key in ("layer_overhead_us", "microbatch_overhead_us", "step_overhead_us"):
        if getattr(p, key) < 0:
            errors.append(f"{where}.{key}={getattr(p, key)} must be >= 0")
    for library, rules in p.mpi_compression.items():
        bad = ([o for o in rules.ops if o not in LIBRARY_OPS]
               + [t for t in rules.dtypes if t not in LIBRARY_DTYPES])
        if bad:
            errors.append(f"{where}.mpi_compression.{library}: {bad} unknown; ops are "
                          f"{list(LIBRARY_OPS)}, dtypes {list(LIBRARY_DTYPES)}")
        if not rules.source:
            errors.append(f"{where}.mpi_compression.{library}.source is empty; name the "
                          "documentation the rules come from")
    for key, text in p.provenance.items():
        if not text.startswith(tuple(f"{m}: " for m in MARKS)):
            errors.append(f"{where}.provenance.{key}='{text}' must start with one of "
                          f"{[m + ':' for m in MARKS]} and name its source")
        if profile_value(p, key) is None and not _optional_field(p, key):
            errors.append(f"{where}.provenance.{key} names no value of the profile; use a "
                          "dotted path such as intra.bandwidth_gbs or codecs.zfp")
    return errors


def _optional_field(p: PerfProfile, key: str) -> bool:
    """Whether key is a field of the profile that is null here (e.g. an NVRTC speed set to
    null by an override: its provenance line still names a field)."""
    head, _, last = key.rpartition(".")
    parent = profile_value(p, head) if head else p
    return parent is not None and not isinstance(parent, dict) and hasattr(parent, last)


def profile_value(p: PerfProfile, key: str) -> object | None:
    """The value at a dotted path of the profile (through fields and dict keys), None if absent."""
    node: object = p
    for part in key.split("."):
        if isinstance(node, dict):
            node = node.get(part)
        else:
            node = getattr(node, part, None)
        if node is None:
            return None
    return node
