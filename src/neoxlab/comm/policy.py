"""A compression scheme as per-dimension policies, its validation, and MPI-library switches."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from neoxlab.compress import CompressionConfigError, Compressor, available, make_compressor
from neoxlab.config import COMPRESSIBLE_DIMS, CompressionConfig, Config

DIMS = COMPRESSIBLE_DIMS  # "other" (control traffic) is never compressed
BACKENDS = ("framework", "mpi")
ALLREDUCE = ("auto", "alltoall", "allgather")
MPI_ALGORITHMS = ("zfp", "mpc")
_HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class DimPolicy:
    compressor: Compressor
    min_bytes: int
    error_feedback: bool

    @property
    def active(self) -> bool:
        return self.compressor.name != "none"


def build_policies(cfg: CompressionConfig) -> dict[str, DimPolicy]:
    """One policy per compressed dimension (missing dimensions are uncompressed)."""
    policies = {}
    for dim, d in cfg.dims.items():
        policies[dim] = DimPolicy(
            make_compressor({"name": d.compressor, **d.params}), d.min_bytes, d.error_feedback
        )
    return policies


def validate_compression(cfg: Config) -> list[str]:
    """Every problem of the scheme, each naming the value, the rule and the fix."""
    c = cfg.compression
    errors: list[str] = []
    if c.backend not in BACKENDS:
        errors.append(f"compression.backend='{c.backend}' is not one of {list(BACKENDS)}")
    if c.allreduce not in ALLREDUCE:
        errors.append(f"compression.allreduce='{c.allreduce}' is not one of {list(ALLREDUCE)}")
    for dim, d in c.dims.items():
        where = f"compression.dims.{dim}"
        if dim not in DIMS:
            errors.append(
                f"{where}: unknown dimension '{dim}'; compressible dimensions are {list(DIMS)} "
                "(control traffic, 'other', is never compressed)"
            )
            continue
        if d.min_bytes < 0:
            errors.append(f"{where}.min_bytes={d.min_bytes} is negative; use 0 or more bytes")
        if d.compressor not in available():
            errors.append(
                f"{where}.compressor='{d.compressor}' is unknown; choose one of {available()}"
            )
            continue
        try:
            comp = make_compressor({"name": d.compressor, **d.params})
        except CompressionConfigError as exc:
            errors.append(f"{where}: {exc}")
            continue
        if d.lossless_only and not comp.lossless:
            errors.append(
                f"{where}.compressor='{comp.describe()}' is lossy but {dim} is marked "
                "lossless_only; use a lossless compressor (mpc, none) or drop lossless_only"
            )
        # the paper's named schemes keep their published rates (ZHybrid's rate 24 on fp16
        # TP/PP is sent raw, skipped before encoding and counted); a custom one is refused
        half = _HALF.get(cfg.train.precision)
        if (c.scheme == "custom" and half is not None and dim in ("tp", "pp")
                and comp.name != "none" and comp.shrinks(half) is False):
            errors.append(
                f"{where}.compressor='{comp.describe()}' cannot shrink {dim} traffic: with "
                f"train.precision={cfg.train.precision} its activations are "
                f"{cfg.train.precision} and would all be sent raw; use a smaller rate (zfp "
                "rate < 16), int8/int4, mpc or none on this dimension"
            )
        if d.error_feedback and (dim != "dp" or comp.lossless):
            errors.append(
                f"{where}.error_feedback=true applies to lossy dp gradients only; "
                "set it to false here"
            )
    if c.backend == "mpi":
        errors += _validate_mpi(c)
    return errors


MPI_REFUSAL = (
    "compression.backend=mpi is refused: no launcher exports the MPI library's compression "
    "switches and torch gets no MPI process group, so the run would be an uncompressed "
    "baseline under a compressed label; use compression.backend=framework (neoxlab's "
    "compressed collectives over gloo/NCCL) with the same dims")


def _validate_mpi(c: CompressionConfig) -> list[str]:
    used = {d.compressor for d in c.dims.values() if d.compressor != "none"}
    bad = sorted(used - set(MPI_ALGORITHMS))
    errors = [MPI_REFUSAL] if used else []
    if bad:
        errors.append(f"compression.backend=mpi supports only {list(MPI_ALGORITHMS)}, "
                      f"not {bad}")
    return errors


def mpi_environment(c: CompressionConfig) -> dict[str, str]:
    """MVAPICH-Plus switches. They are global, not per communicator: the dp setting (the
    dominant traffic) is applied to every message, so hybrids cannot be expressed here."""
    if c.backend != "mpi":
        return {}
    dp = c.dims.get("dp")
    chosen = dp if dp is not None and dp.compressor != "none" else next(
        (d for d in c.dims.values() if d.compressor != "none"), None
    )
    if chosen is None:
        return {"MPIR_CVAR_ENABLE_COMPRESSION": "0"}
    env = {
        "MPIR_CVAR_ENABLE_COMPRESSION": "1",
        "MPIR_CVAR_COMPRESSION_ALGORITHM": chosen.compressor,
        "MPIR_CVAR_COMPRESSION_DATA_TYPE": "FLOAT",
    }
    if chosen.compressor == "zfp":
        env["MPIR_CVAR_ZFP_RATE"] = str(chosen.params.get("rate", 16))
    return env
