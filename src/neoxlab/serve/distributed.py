"""torch.distributed and megatron-core groups for serving: one model replica over TP ranks.

Megatron's TP layers need its parallel state even at TP=1, so a lone process (tests, bench)
still starts a one-rank gloo group. The backend follows the device the rank computes on
(run.device.backend_for): NCCL for a GPU's tensors, gloo for the host's.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state

from neoxlab.run import dist
from neoxlab.run.device import backend_for

HOST = torch.device("cpu")


def init_model_parallel(tp: int, device: torch.device = HOST) -> None:
    """Start torch.distributed (from the env dist.discover exported) with the backend of
    `device`, and megatron's groups."""
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend=backend_for(device))
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)


def init_single_process() -> None:
    """A one-rank host group on a free local port (no MPI launcher needed)."""
    if not torch.distributed.is_initialized():  # no env vars: child launches must not inherit
        torch.distributed.init_process_group(
            backend=backend_for(HOST), init_method=f"tcp://127.0.0.1:{dist.free_port()}",
            rank=0, world_size=1)
    init_model_parallel(1)


def shutdown() -> None:
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
