"""Which GPU a rank uses, chosen from what its launcher made visible, and LOCAL_RANK to match.

Launchers differ in what a rank sees. jsrun -g 1 -a 1 and srun --gpus-per-task=1 give each
rank one GPU (cuda:0) while the node-local rank still runs 0..3; srun with the whole node's
GPUs visible and mpiexec show every GPU to every rank; jsrun -a 2 -g 2 shows a resource set's
two GPUs to its two ranks. In every case the rank's GPU is its node-local rank modulo the
number of visible devices (ranks placed in blocks per node or per resource set).

DeepSpeed then calls set_device(LOCAL_RANK) and asserts OMPI_COMM_WORLD_LOCAL_RANK ==
LOCAL_RANK whenever the Open MPI name is set (jsrun always sets it), so LOCAL_RANK and each
launcher local-rank variable present are set to the chosen index; the launcher's node-local
rank is kept under NODE_LOCAL_RANK_ENV, so that a second call chooses the same device.

Standard library and torch only (imported when a device is chosen), for every rank program:
the builtin training program, serving and the GPT-NeoX entry. `rank_device` turns
cluster.device into the torch device a rank computes on, and `backend_for` names the
torch.distributed backend for tensors there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# The node-local rank as each launcher exports it, innermost launcher first (mpiexec inside
# a Slurm allocation sets SLURM_LOCALID per proxy, MPI_LOCALRANKID per rank):
# jsrun; jsrun / Spectrum MPI and mpirun / Open MPI; mpiexec of MPICH (hydra) and Intel
# MPI; MVAPICH2's mpirun_rsh; PMI-based launchers; Cray PALS; srun.
LAUNCHER_LOCAL_RANK_VARS = (
    "JSM_NAMESPACE_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "PMI_LOCAL_RANK",
    "PALS_LOCAL_RANKID",
    "SLURM_LOCALID",
)
NODE_LOCAL_RANK_ENV = "NEOXLAB_NODE_LOCAL_RANK"


@dataclass(frozen=True)
class DeviceChoice:
    index: int  # cuda:<index> among the devices this process sees
    node_local_rank: int
    visible: int  # devices this process sees
    source: str  # the variable the node-local rank came from

    def describe(self) -> str:
        seen = os.environ.get("CUDA_VISIBLE_DEVICES")
        shown = f" (CUDA_VISIBLE_DEVICES={seen})" if seen is not None else ""
        return (f"cuda:{self.index} of {self.visible} visible{shown}, node-local rank "
                f"{self.node_local_rank} from {self.source}")


def select_device(local_rank: int | None = None,
                  environ: MutableMapping[str, str] | None = None) -> DeviceChoice:
    """Choose this rank's GPU, make it current and set LOCAL_RANK (and the launcher's
    local-rank variables) to its index. `local_rank`: the node-local rank when the caller
    knows it (MPI's), else it is read from the environment. Raises when no CUDA device is
    visible."""
    # deferred: torch, only where a rank picks its GPU
    import torch

    env = os.environ if environ is None else environ
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if local_rank is None:
        local, source = node_local_rank(env)
    else:
        local, source = local_rank, "MPI's node-local communicator"
    if visible < 1:
        raise RuntimeError(
            f"no CUDA device is visible to node-local rank {local} "
            f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '<unset>')}): a GPU run "
            "needs one per rank; give each rank one (jsrun -g 1, srun --gpus-per-task=1) or "
            "run on CPU (cluster.device=cpu)")
    choice = DeviceChoice(device_index(local, visible), local, visible, source)
    align_local_rank(choice.index, local, env)
    torch.cuda.set_device(choice.index)
    return choice


def rank_device(cluster_device: str) -> tuple[torch.device, str]:
    """(the device this rank computes on, a line saying which): the host for
    cluster.device=cpu, else this rank's GPU (select_device). Raises, naming the value and
    the fix, when the config asks for a GPU but torch sees none, before anything starts."""
    # deferred: torch, only where a rank picks its GPU
    import torch

    if cluster_device == "cpu":
        return torch.device("cpu"), "cpu (cluster.device=cpu)"
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"cluster.device='{cluster_device}' asks for a GPU, but torch sees no CUDA device "
            "here (torch.cuda.is_available() is False, CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}): run the ranks on GPU "
            "nodes (one GPU per rank) with a CUDA build of torch, or set cluster.device=cpu")
    choice = select_device()
    return torch.device("cuda", choice.index), choice.describe()


def backend_for(device: torch.device | str) -> str:
    """The torch.distributed backend for tensors on `device`: a process group serves one
    device, NCCL a GPU's, gloo the host's."""
    kind = device if isinstance(device, str) else device.type
    return "nccl" if kind.split(":")[0] == "cuda" else "gloo"


def node_local_rank(environ: Mapping[str, str] | None = None) -> tuple[int, str]:
    """(node-local rank, the variable it came from): ours once set, else the innermost
    launcher's, else LOCAL_RANK (run.dist exports MPI's node-local rank there); 0 for a
    process no launcher started."""
    env = os.environ if environ is None else environ
    for name in (NODE_LOCAL_RANK_ENV, *LAUNCHER_LOCAL_RANK_VARS, "LOCAL_RANK"):
        value = env.get(name)
        if value is None or value == "":
            continue
        try:
            rank = int(value)
        except ValueError:
            raise ValueError(f"{name}={value!r} is not a node-local rank: it must be an "
                             "integer >= 0; unset it or let the launcher set it") from None
        if rank < 0:
            raise ValueError(f"{name}={value!r} is negative: a node-local rank is >= 0")
        return rank, name
    return 0, "no launcher variable (a lone process)"


def device_index(node_local_rank: int, visible: int) -> int:
    """The GPU of a rank among `visible` devices: one visible -> 0 (jsrun -g 1,
    srun --gpus-per-task=1); a node's or resource set's GPUs -> its place in the block."""
    if visible < 1:
        raise ValueError(f"visible={visible}: a device index needs at least one device")
    return node_local_rank % visible


def align_local_rank(local_rank: int, node_local_rank: int,
                     environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set LOCAL_RANK and each launcher variable present to local_rank; return the values
    that changed. Only variables the launcher set are rewritten (an absent one stays absent,
    so nothing mistakes this process for another launcher's)."""
    env = os.environ if environ is None else environ
    env[NODE_LOCAL_RANK_ENV] = str(node_local_rank)
    changed = {}
    for name in LAUNCHER_LOCAL_RANK_VARS:
        if name in env and env[name] != str(local_rank):
            changed[name] = env[name]
            env[name] = str(local_rank)
    env["LOCAL_RANK"] = str(local_rank)
    return changed
