"""Install the compression patch for a run, before DeepSpeed initializes."""

from __future__ import annotations

import os

import torch

from neoxlab.comm.capture import Capture
from neoxlab.comm.classify import Classifier, Grid
from neoxlab.comm.patch import CompressionPatch
from neoxlab.comm.scheme import (
    GROUP_OF,
    build_dim_compression,
    communication_dtype,
    library_label,
    mpi_environment,
)
from neoxlab.comm.slow_link import SlowLink
from neoxlab.comm.strict import strict_from_env
from neoxlab.config import Config
from neoxlab.layout import Layout


class MpiCompressionUnavailable(RuntimeError):
    """compression.backend=mpi on ranks whose MPI library would not compress."""


DTYPE_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
SHM_COMM_OP = "deepspeed_shm_comm"  # deepspeed.ops.op_builder's ShareMemCommBuilder.NAME


def skip_unused_deepspeed_op() -> None:
    """DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce (~35 s of C++ on a
    fresh machine or venv) that only its inference path uses (inference_all_reduce, which
    then falls back to torch.distributed); training never calls it, so mark it unavailable
    before deepspeed.init_distributed would build it."""
    # deferred: deepspeed is slow to import; only processes that install a run need it
    import deepspeed.ops  # third-party, here: only processes that install a run import it

    deepspeed.ops.__compatible_ops__[SHM_COMM_OP] = False


def install_for_run(cfg: Config, layout: Layout) -> CompressionPatch | None:
    """The framework patch (None when compression.patch is off). With compression.backend=
    mpi it compresses nothing itself: it accounts every call and labels the traffic the MPI
    library compresses, after making sure the library really will. Either way DeepSpeed's
    unused inference op is skipped first (train program and GPT-NeoX's ranks alike)."""
    skip_unused_deepspeed_op()
    c = cfg.compression
    label = library_label(c) if c.backend == "mpi" else None
    if label is not None:
        require_compressing_library(mpi_environment(c))
    if not c.patch:
        return None
    classifier = Classifier(Grid(tp=layout.tp, pp=layout.pp, dp=layout.dp),
                            hidden_size=cfg.model.hidden_size,
                            tokens=layout.micro_batch * cfg.model.seq_length)
    policies = build_dim_compression(c) if c.backend == "framework" else {}
    on_mpi = {g for g, b in cfg.engine.group_backends.items() if b == "mpi"}
    library = {dim: label for dim, group in GROUP_OF.items()
               if label is not None and group in on_mpi}
    a = c.auto
    slow = (SlowLink(a.slow_link_s_per_mb) if c.scheme == "auto"
            and a.slow_link_from_step is not None else None)
    patch = CompressionPatch(policies, classifier, c.allreduce, strict_from_env(),
                             library=library, slow_link=slow).install()
    line = raw_dims_line(cfg)
    if line is not None and os.environ.get("RANK", "0") == "0":
        print(line, flush=True)
    t = cfg.tune
    if t.capture_tensors > 0:  # task=tune's capture run: messages for its codec proxy
        patch.capture = Capture(t.capture_tensors, t.capture_max_numel, t.min_bytes)
    return patch


def raw_dims_line(cfg: Config) -> str | None:
    """One start-up line naming the dimensions whose codec cannot shrink the dtype their
    messages travel in (DP gradients: the communication dtype; activations and ZeRO's
    parameters: the training precision), which the patch therefore sends raw; None when
    there are none."""
    c = cfg.compression
    if c.backend != "framework":
        return None
    by_reason: dict[str, list[str]] = {}
    for dim, policy in sorted(build_dim_compression(c).items()):
        name = communication_dtype(cfg) if dim == "dp" else cfg.train.precision
        dtype = getattr(torch, DTYPE_NAMES.get(name, "float32"))
        codec = policy.compressor
        if not policy.active or codec.shrinks(dtype) is not False:
            continue
        bits = codec.wire_bits(dtype)
        why = (f"{codec.describe()} cannot shrink {str(dtype).removeprefix('torch.')} values"
               + (f" ({bits:g} bits a value for {8 * dtype.itemsize})" if bits else ""))
        by_reason.setdefault(why, []).append(dim)
    if not by_reason:
        return None
    parts = "; ".join(f"{', '.join(dims)}: {why}" for why, dims in by_reason.items())
    return (f"[neoxlab] compression: left raw (plain collectives, accounted as raw): "
            f"{parts}")


def require_compressing_library(switches: dict[str, str]) -> None:
    """Refuse to train when the library loaded here is not MVAPICH or its switches are not
    in the environment: the run would be uncompressed under a compressed label."""
    # deferred: mpi4py initialises MPI on import
    from mpi4py import MPI

    version = MPI.Get_library_version().strip().splitlines()[0]
    missing = {k: v for k, v in switches.items() if os.environ.get(k) != v}
    if "MVAPICH" not in version.upper() or missing:
        raise MpiCompressionUnavailable(
            f"compression.backend=mpi, but the ranks run on '{version}'"
            + (f" without {missing}" if missing else "")
            + ": it would not compress; load MVAPICH-Plus (cluster.mpi_library=mvapich-plus, "
            "cluster.modules) and launch through neoxlab's job script, or use "
            "compression.backend=framework")
