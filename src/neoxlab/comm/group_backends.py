"""Per-dimension process-group backends: e.g. the DP groups on MPI, TP/PP on gloo or NCCL.

DeepSpeed's grid and megatron-core create their groups with torch.distributed.new_group and
no backend, so every group gets the world's. While installed, this router gives a group
whose rank set is a DP, TP or pipeline rank set of the layout (engine.group_backends) the
chosen backend instead; ZeRO's all-gathers run on the DP groups, so they follow `dp`.
A group created with an explicit backend (megatron's gloo side groups) is left alone.
"""

from __future__ import annotations

import functools
import inspect
from collections import Counter

import torch.distributed as dist

from neoxlab.comm import mpi_group
from neoxlab.comm.classify import Grid

DIMS = ("dp", "tp")
# DeepSpeed's pipeline sends activations with send/recv on the world group (its 2-rank pipe
# groups serve only its old broadcast path), so pipeline traffic follows engine.backend
NOT_ROUTABLE = {"pp": "DeepSpeed's pipeline sends activations with send/recv on the world "
                      "group, which stays on engine.backend"}
CHOICES = ("mpi",)  # engine.group_backends values (anything else: the world's backend)
_AXIS_DIM = {"dp": "dp", "tp": "tp", "pipe": "pp"}


def validate_group_backends(backends: dict[str, str], routes_groups: bool) -> list[str]:
    """engine.group_backends problems, each with the value, the rule and the fix
    (routes_groups: the engine builds its groups through GroupRouter)."""
    errors = []
    for dim, choice in backends.items():
        if dim in NOT_ROUTABLE:
            errors.append(f"engine.group_backends.{dim}: {NOT_ROUTABLE[dim]}, so a {dim} "
                          f"backend would change nothing; drop the key (routable: {list(DIMS)})")
        elif dim not in DIMS:
            errors.append(f"engine.group_backends.{dim}: unknown dimension; use one of "
                          f"{list(DIMS)} (ZeRO all-gathers run on the dp groups)")
        if choice not in CHOICES:
            errors.append(f"engine.group_backends.{dim}='{choice}' is not one of "
                          f"{list(CHOICES)}; drop the key to keep the world's backend")
    if backends and not routes_groups:
        errors.append(f"engine.group_backends={dict(backends)} needs engine=builtin (this "
                      "engine builds its groups without neoxlab's router); drop "
                      "engine.group_backends")
    return errors


class GroupRouter:
    """Replaces torch.distributed.new_group while the engines build their groups."""

    def __init__(self, grid: Grid, backends: dict[str, str]):
        self.grid = grid
        self.backends = {dim: _torch_name(choice) for dim, choice in backends.items()}
        self.sets = {ranks: _AXIS_DIM[axis] for ranks, axis in grid.group_sets().items()}
        self.created: Counter[tuple[str, str]] = Counter()  # (dim, backend) -> groups
        self._original = None

    def dim_of(self, ranks) -> str | None:
        """dp/tp/pp for a layout rank set (two adjacent pipeline stages are pp too)."""
        members = frozenset(ranks)
        dim = self.sets.get(members)
        if dim is None and len(members) == 2:
            a, b = (self.grid.coord(r) for r in sorted(members))
            if a[1:] == b[1:] and abs(a[0] - b[0]) in (1, self.grid.pp - 1):
                dim = "pp"
        return dim

    def install(self) -> GroupRouter:
        if any(b == mpi_group.BACKEND for b in self.backends.values()):
            mpi_group.register()
        self._original = original = dist.new_group
        signature = inspect.signature(original)

        @functools.wraps(original)
        def new_group(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            ranks = bound.arguments.get("ranks")
            dim = self.dim_of(ranks) if ranks else None
            if bound.arguments.get("backend") is None and dim in self.backends:
                bound.arguments["backend"] = self.backends[dim]
            backend = bound.arguments.get("backend") or "world"
            self.created[(dim or "other", str(backend))] += 1
            return original(*bound.args, **bound.kwargs)

        dist.new_group = new_group
        return self

    def uninstall(self) -> None:
        if self._original is not None:
            dist.new_group = self._original
            self._original = None


def _torch_name(choice: str) -> str:
    return mpi_group.BACKEND if choice == "mpi" else choice


def backend_of(group) -> str:
    """The backend name of a group (the world's for None)."""
    return str(dist.get_backend(group))
