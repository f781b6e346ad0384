"""Compression config rules (scheme, dimensions, codecs, the MPI library's own compression),
checked before anything starts; each problem names the value, the rule and the fix."""

from __future__ import annotations

import torch

from neoxlab.comm.scheme import GROUP_OF, communication_dtype
from neoxlab.compress import CompressionConfigError, available, make_compressor
from neoxlab.compress.kernels import cluster_choice
from neoxlab.compress.registry import fused_codecs
from neoxlab.config import COMPRESSIBLE_DIMS, Config
from neoxlab.config.profile import torch_codecs_on

DIMS = COMPRESSIBLE_DIMS  # "other" (control traffic) is never compressed
BACKENDS = ("framework", "mpi")
ALLREDUCE = ("auto", "alltoall", "allgather")
COMM_DTYPES = ("fp32", "fp16", "bf16")
MPI_ALGORITHMS = ("zfp", "mpc")
_HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
MPI_LIBRARIES = ("mpich", "openmpi", "spectrum", "mvapich2-gdr", "mvapich-plus")
COMPRESSING_LIBRARIES = ("mvapich-plus",)  # MPIR_CVAR_ENABLE_COMPRESSION & co.


def validate_compression(cfg: Config, trains: bool) -> list[str]:
    """Every problem of the scheme, each naming the value, the rule and the fix; `trains`: the
    task's record says its ranks train (compression=auto needs a training run)."""
    c = cfg.compression
    errors: list[str] = []
    if c.backend not in BACKENDS:
        errors.append(f"compression.backend='{c.backend}' is not one of {list(BACKENDS)}")
    if c.allreduce not in ALLREDUCE:
        errors.append(f"compression.allreduce='{c.allreduce}' is not one of {list(ALLREDUCE)}")
    if c.communication_dtype is not None and c.communication_dtype not in COMM_DTYPES:
        errors.append(f"compression.communication_dtype='{c.communication_dtype}' is not one "
                      f"of {list(COMM_DTYPES)}; or null for the training precision")
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
        # TP/PP goes through the plain collectives, accounted as raw); a custom one is refused
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
    if cfg.cluster.mpi_library not in MPI_LIBRARIES:
        errors.append(f"cluster.mpi_library='{cfg.cluster.mpi_library}' is not one of "
                      f"{list(MPI_LIBRARIES)}; name the library the ranks run on")
    if c.backend == "mpi":
        errors += _validate_mpi(cfg)
    errors += _reduce_to_owner_on_nccl(cfg)
    if c.scheme == "auto":
        errors += _validate_auto(cfg, trains)
    return errors


AUTO_STARTS = ("tuned", "model", "given")
AUTO_REFERENCES = ("profile", "measured")


def _validate_auto(cfg: Config, trains: bool) -> list[str]:
    """compression=auto: a training run whose patch compresses (it switches the patch's
    codecs) and re-check settings that can run."""
    c, a = cfg.compression, cfg.compression.auto
    errors = []
    if not trains:
        errors.append(f"compression=auto with task={cfg.task.name}: it re-checks a training "
                      "run's links while it trains; use task=train, or a fixed scheme here "
                      "(task=tune writes one: configs/compression/tuned_<exp>.yaml)")
    if c.backend != "framework" or not c.patch:
        errors.append(f"compression=auto with compression.backend={c.backend}, compression."
                      f"patch={c.patch}: it switches the framework patch's codecs; use "
                      "compression.backend=framework and compression.patch=true")
    if a.recheck_every < 2:
        errors.append(f"compression.auto.recheck_every={a.recheck_every}: a re-check sums "
                      "the steps since the last one; use 2 or more")
    for spec in a.codecs:
        try:
            make_compressor(spec)
        except CompressionConfigError as exc:
            errors.append(f"compression.auto.codecs: {exc}")
    if "none" not in a.codecs:
        errors.append(f"compression.auto.codecs={list(a.codecs)} lacks 'none': a dimension "
                      "the model finds no saving on must be able to go uncompressed; add it")
    if a.start not in AUTO_STARTS:
        errors.append(f"compression.auto.start='{a.start}' is not one of {list(AUTO_STARTS)}")
    if a.reference not in AUTO_REFERENCES:
        errors.append(f"compression.auto.reference='{a.reference}' is not one of "
                      f"{list(AUTO_REFERENCES)}")
    if a.slow_link_s_per_mb < 0 or (a.slow_link_from_step is not None
                                    and a.slow_link_from_step < 1):
        errors.append(f"compression.auto.slow_link_from_step={a.slow_link_from_step}, "
                      f"slow_link_s_per_mb={a.slow_link_s_per_mb}: the stand-in slow link "
                      "needs a step >= 1 and seconds per MB >= 0 (null: off)")
    return errors


def validate_online_engine(cfg: Config, rechecks: bool) -> list[str]:
    """compression=auto needs an engine whose training loop re-checks and switches codecs
    (its registry fact `rechecks_compression`)."""
    if cfg.compression.scheme != "auto" or rechecks:
        return []
    return [f"compression=auto with engine={cfg.engine.name}: its training loop cannot "
            "re-check the links or switch the codecs while it trains; use engine=builtin, or "
            "run a fixed scheme (task=tune picks one: compression=tuned_<exp>)"]


def _reduce_to_owner_on_nccl(cfg: Config) -> list[str]:
    """A compressed reduce to owners sends each owner its n-1 payloads point to point, one
    after another. Under NCCL every first send between two ranks builds a communicator of
    its own (up to dp*(dp-1) per DP group, each with its own buffers), so it is refused on
    NCCL DP groups; the all-reduce of buckets (all-to-all, then all-gather) runs on
    collectives NCCL runs well."""
    c, z, e = cfg.compression, cfg.zero, cfg.engine
    dp = c.dims.get("dp")
    compressed = (c.patch and c.backend == "framework" and dp is not None
                  and dp.compressor != "none")
    if not (z.reduce_to_owner and compressed):
        return []
    world = e.backend if e.backend != "auto" else (
        "nccl" if cfg.cluster.device != "cpu" else "gloo")
    if e.group_backends.get("dp", world) != "nccl":
        return []
    return [
        "zero.reduce_to_owner=true with compressed dp gradients on NCCL "
        f"(engine.backend={e.backend}, cluster.device={cfg.cluster.device}): each owner "
        "would receive its n-1 payloads by point-to-point, one after another, and NCCL "
        "builds a communicator for every first pair of ranks; drop zero.reduce_to_owner "
        "(buckets are then all-reduced by all-to-all and all-gather) or put dp on MPI "
        "(engine.group_backends.dp=mpi)"
    ]




def _setting(d) -> tuple[str, tuple] | None:
    return None if d is None or d.compressor == "none" else (
        d.compressor, tuple(sorted(d.params.items())))


def _validate_mpi(cfg: Config) -> list[str]:
    """compression.backend=mpi: the MPI library compresses what runs on MPI groups. Refused
    unless it really can, so a run is never uncompressed under a compressed label."""
    c, library = cfg.compression, cfg.cluster.mpi_library
    compressed = {dim: d for dim, d in c.dims.items() if d.compressor != "none"}
    if not compressed:
        return []
    errors = []
    bad = sorted({d.compressor for d in compressed.values()} - set(MPI_ALGORITHMS))
    if bad:
        errors.append(f"compression.backend=mpi supports only {list(MPI_ALGORITHMS)}, "
                      f"not {bad}; use those or compression.backend=framework")
    if library not in COMPRESSING_LIBRARIES:
        errors.append(
            f"compression.backend=mpi needs an MPI library that compresses on the fly, but "
            f"cluster.mpi_library='{library}' has none (only {list(COMPRESSING_LIBRARIES)}); "
            "use compression.backend=framework (neoxlab's codecs, also on MPI groups with "
            "engine.group_backends.dp=mpi) or a cluster running mvapich-plus")
    payload = communication_dtype(cfg)
    if "dp" in compressed and payload != "fp32":
        errors.append(
            f"compression.backend=mpi: the MPI library compresses FLOAT (fp32) data only, but "
            f"DP gradients travel as {payload} (train.precision={cfg.train.precision}, "
            f"compression.communication_dtype={c.communication_dtype}); set "
            "compression.communication_dtype=fp32 (the paper's fp32 payloads)")
    on_mpi = {g for g, b in cfg.engine.group_backends.items() if b == "mpi"}
    for dim in sorted(compressed):
        if compressed[dim].error_feedback:
            errors.append(f"compression.dims.{dim}.error_feedback=true needs compression."
                          "backend=framework (the MPI library keeps no residual); set it to "
                          "false or use the framework backend")
        group = GROUP_OF.get(dim)
        if group is not None and group not in on_mpi:
            fix = (f"set engine.group_backends.{group}=mpi or " if group != "pp" else "")
            errors.append(
                f"compression.dims.{dim} is to be compressed by the MPI library, but {dim} "
                f"traffic runs on backend '{cfg.engine.backend}', not MPI; {fix}set "
                f"compression.dims.{dim}.compressor=none")
    # the library's switches are global: one setting for everything on MPI groups
    settings = {dim: _setting(c.dims.get(dim)) for dim, group in GROUP_OF.items()
                if group in on_mpi}
    if len(set(settings.values())) > 1:
        shown = ", ".join(f"{dim}={s[0] + str(dict(s[1])) if s else 'none'}"
                          for dim, s in sorted(settings.items()))
        errors.append(
            f"compression.backend=mpi: the MPI library's switches are global, so every "
            f"dimension on MPI groups gets one setting, but they differ ({shown}); give "
            "them the same compressor and params, or move the others off MPI "
            "(engine.group_backends)")
    return errors


def codec_kernel_warning(cfg: Config) -> str | None:
    """A GPU cluster without Triton (cluster.arch, e.g. Lassen's ppc64le) runs the framework
    codecs' NVRTC kernels, or their torch-ops path where its profile prices no NVRTC path
    (compress/kernels.py decides): said at planning, with the throughput the profile
    expects."""
    c = cfg.compression
    used = sorted({d.compressor for d in c.dims.values() if d.compressor in fused_codecs()})
    if not (c.patch and c.backend == "framework" and used
            and torch_codecs_on(cfg.cluster.device, cfg.cluster.arch)):
        return None
    profile = cfg.cluster.profile
    codecs = {n: profile.codecs.get(n) for n in used} if profile is not None else {}
    nvrtc = all(p is not None and p.nvrtc_encode_gbs for p in codecs.values()) and bool(codecs)
    kind = cluster_choice(cfg.cluster.device, cfg.cluster.arch, nvrtc).kernels
    speeds = []
    for name, p in codecs.items():
        gbs = p.nvrtc_encode_gbs if kind == "nvrtc" else p.torch_encode_gbs if p else None
        if p is not None and gbs:
            speeds.append(f"{name} ~{gbs:g} GB/s encode against {p.encode_gbs:g} GB/s fused")
    expected = f" (expected: {'; '.join(speeds)})" if speeds else ""
    path = ("NVRTC kernels (CUDA C compiled at first use; their speed assumed until "
            "measured)" if kind == "nvrtc" else
            "torch-ops path, about a hundred kernels per chunk")
    return (f"cluster.arch={cfg.cluster.arch}: Triton has no wheel for it, so {', '.join(used)}"
            f" run their {path} on the GPU{expected}; task=predict prices it; "
            "bench/device/device_codecs.py measures it there (docs/gpus.md, Codec kernels)")
