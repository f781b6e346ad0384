"""A compression scheme as one DimCompression per parallel dimension, and the MPI library's
switches (its rules: comm/compression_rules.py)."""

from __future__ import annotations

from dataclasses import dataclass

from neoxlab.compress import Compressor, make_compressor
from neoxlab.config import CompressionConfig, Config

GROUP_OF = {"dp": "dp", "zero": "dp", "tp": "tp", "pp": "pp"}  # zero runs on the dp groups


@dataclass
class DimCompression:
    compressor: Compressor
    min_bytes: int
    error_feedback: bool

    @property
    def active(self) -> bool:
        return self.compressor.name != "none"


def build_dim_compression(cfg: CompressionConfig) -> dict[str, DimCompression]:
    """One DimCompression per compressed dimension (missing dimensions are uncompressed)."""
    policies = {}
    for dim, d in cfg.dims.items():
        policies[dim] = DimCompression(
            make_compressor({"name": d.compressor, **d.params}), d.min_bytes, d.error_feedback
        )
    return policies


def communication_dtype(cfg: Config) -> str:
    """The dtype DP gradient reductions travel in."""
    return cfg.compression.communication_dtype or cfg.train.precision


def library_label(c: CompressionConfig) -> str | None:
    """How the accounting names traffic the MPI library compresses (None: it does not)."""
    env = mpi_environment(c)
    if not env:
        return None
    algorithm = env["MPIR_CVAR_COMPRESSION_ALGORITHM"]
    rate = f" rate={env['MPIR_CVAR_ZFP_RATE']}" if algorithm == "zfp" else ""
    return f"compressed by the MPI library ({algorithm}{rate})"


def mpi_environment(c: CompressionConfig) -> dict[str, str]:
    """MVAPICH-Plus switches, for the ranks' environment (empty unless the library is to
    compress). They are global, not per communicator: validation requires one setting for
    every dimension on MPI groups (engine.group_backends), so hybrids split across backends."""
    if c.backend != "mpi":
        return {}
    dp = c.dims.get("dp")
    chosen = dp if dp is not None and dp.compressor != "none" else next(
        (d for d in c.dims.values() if d.compressor != "none"), None
    )
    if chosen is None:
        return {}  # exported only for runs that use them
    env = {
        "MPIR_CVAR_ENABLE_COMPRESSION": "1",
        "MPIR_CVAR_COMPRESSION_ALGORITHM": chosen.compressor,
        "MPIR_CVAR_COMPRESSION_DATA_TYPE": "FLOAT",
    }
    if chosen.compressor == "zfp":
        env["MPIR_CVAR_ZFP_RATE"] = str(chosen.params.get("rate", 16))
    return env


# What an MPI library (cluster.mpi_library) needs before it takes CUDA device pointers:
# MVAPICH2-GDR reads MV2_USE_CUDA; MVAPICH-Plus, built on MPICH 4, reads MPICH's control
# variables (as for its compression switches above); Open MPI's CUDA support is an MCA
# parameter; Spectrum MPI's is a jsrun option (SPECTRUM_JSRUN_ARGS); MPICH needs nothing.
DEVICE_BUFFER_ENV = {
    "mvapich2-gdr": {"MV2_USE_CUDA": "1"},
    "mvapich-plus": {"MPIR_CVAR_ENABLE_GPU": "1"},
    "openmpi": {"OMPI_MCA_opal_cuda_support": "true"},
}
SPECTRUM_JSRUN_ARGS = "-gpu"


def mpi_carries_device_buffers(cfg: Config) -> bool:
    """Whether the run hands CUDA tensors to the MPI library: a GPU cluster with a dimension
    on MPI process groups (engine.group_backends) or compressed by the library."""
    on_mpi = any(b == "mpi" for b in cfg.engine.group_backends.values())
    return cfg.cluster.device != "cpu" and (on_mpi or cfg.compression.backend == "mpi")


def mpi_device_environment(cfg: Config) -> dict[str, str]:
    """The library's CUDA switches for the ranks' environment (empty unless the run hands
    it device buffers, so that other runs start as before)."""
    if not mpi_carries_device_buffers(cfg):
        return {}
    return dict(DEVICE_BUFFER_ENV.get(cfg.cluster.mpi_library, {}))


# jsrun starts every task under Spectrum MPI's CUDA hook unless told otherwise; on Lassen a
# run that hands MPI no GPU buffer (NCCL only) or runs another MPI then fails with "CUDA Hook
# Library: Failed to find symbol mem_find_dreg_entries". So every LSF job names one of:
SPECTRUM_NO_GPU_ARGS = "-disable_gpu_hooks"  # Spectrum, no device buffers through MPI
NOT_SPECTRUM_ARGS = "off"  # another MPI (MVAPICH2-GDR, MVAPICH-Plus, Open MPI, MPICH)
# MVAPICH pins each rank to one core by default, whatever jsrun -c gives it, so torch's
# threads, NCCL's proxy and the data loaders would share that core. MVAPICH2(-GDR) reads
# MV2_ENABLE_AFFINITY; MVAPICH 3 / MVAPICH-Plus renamed its variables MVP_* (both are set
# there: an assumption that costs nothing where the name is not read).
AFFINITY_ENV = {
    "mvapich2-gdr": {"MV2_ENABLE_AFFINITY": "0"},
    "mvapich-plus": {"MV2_ENABLE_AFFINITY": "0", "MVP_ENABLE_AFFINITY": "0"},
}


def jsrun_smpiargs(cfg: Config) -> str:
    """jsrun --smpiargs of every LSF job: -gpu for Spectrum runs that hand it device buffers,
    -disable_gpu_hooks for other Spectrum runs, off for an MPI that is not Spectrum."""
    if cfg.cluster.mpi_library != "spectrum":
        return NOT_SPECTRUM_ARGS
    return SPECTRUM_JSRUN_ARGS if mpi_carries_device_buffers(cfg) else SPECTRUM_NO_GPU_ARGS


def mpi_affinity_environment(cfg: Config) -> dict[str, str]:
    """MVAPICH's own core binding off, for every rank of every engine (launch/ranks.py)."""
    return dict(AFFINITY_ENV.get(cfg.cluster.mpi_library, {}))
