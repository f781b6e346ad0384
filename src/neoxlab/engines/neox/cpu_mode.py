"""GPT-NeoX on CPU ranks: run-time patches, no edit of the user's checkout.

GPT-NeoX at the locked commit (patches/upstream.lock) assumes CUDA: it asserts it at start-up,
skips building its TP/PP/DP groups and seeding without a device count, and calls a dozen
`torch.cuda` functions that on a CPU build of torch can only raise. On a CPU cluster
(cluster.device=cpu) `apply()` makes those calls do the CPU equivalent, in the rank's own
process, before GPT-NeoX's train.py runs (inject.install_from_env calls it, from our entry or
the start-up shim). On a GPU cluster nothing here is imported or applied.

Two kinds of patch (docs/neox.md lists each with its reason):
- queries (`is_available`, `device_count`) answer "CUDA present" to GPT-NeoX's own modules
  only (callers named `megatron.*`), so torch and DeepSpeed keep their CPU paths;
- calls that can only raise on a CPU build (`current_device`, `set_device`, `synchronize`,
  the typed tensor constructors, the RNG state, `Tensor.cuda`, nvtx) are replaced for every
  caller: the replacement only changes what would otherwise be an exception.
Beside them: apex's FusedAdam is not installed and DeepSpeed's own FusedAdam is a one-time
~130 s C++ build on CPU, so GPT-NeoX's fallback `deepspeed.ops.adam.FusedAdam` becomes
torch's AdamW (FusedAdam's default adam_w_mode is AdamW's decoupled weight decay).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
import torch.cuda.nvtx

OWN_MODULES = "megatron"  # GPT-NeoX's package: the callers that are told CUDA is present
BANNER = "GPT-NeoX runs in CPU mode (torch.cuda patched at run time; docs/neox.md)"
RANKS_PER_NODE_ENV = "NEOXLAB_RANKS_PER_NODE"
TYPED_TENSORS = ("LongTensor", "ByteTensor", "FloatTensor", "IntTensor")


class _State:
    applied = False
    ranks_per_node = 1
    originals: dict[str, Any] = {}


_state = _State()


def applied() -> bool:
    return _state.applied


def _from_gpt_neox(depth: int = 2) -> bool:
    """Is the caller `depth` frames up one of GPT-NeoX's own modules?"""
    name = sys._getframe(depth).f_globals.get("__name__", "")
    return name == OWN_MODULES or name.startswith(OWN_MODULES + ".")


def _is_available() -> bool:
    if _from_gpt_neox():
        return True  # initialize.py asserts it ("Megatron requires CUDA")
    return _state.originals["is_available"]()


def _device_count() -> int:
    if _from_gpt_neox():
        # initialize.py builds the TP/PP/DP groups and seeds the model-parallel RNG only with
        # a count > 0, and asserts LOCAL_RANK == rank % count: the ranks of one node.
        return _state.ranks_per_node
    return _state.originals["device_count"]()


def _current_device() -> str:
    return "cpu"  # used as `device=` and as `.cuda(<device>)`'s argument


def _no_op(name: str):
    """A do-nothing stand-in for torch.cuda.<name>; one function object per name, since
    torch._dynamo's trace rules refuse one object seen under two torch names."""

    def no_op(*args: Any, **kwargs: Any) -> None:
        return None

    no_op.__name__ = no_op.__qualname__ = f"cpu_mode_{name}"
    return no_op


def _tensor_cuda(self, device: Any = None, non_blocking: bool = False, **kwargs: Any):
    return self  # the tensor stays where it is: on the CPU


def _get_rng_state(device: Any = "cuda"):
    return torch.get_rng_state()  # checkpoints save it beside the CPU state


def _set_rng_state(state: Any, device: Any = "cuda") -> None:
    torch.set_rng_state(state)


def _adamw_factory():
    """FusedAdam's signature, building torch's AdamW (decoupled weight decay, FusedAdam's
    default adam_w_mode); the flags that only steer the fused kernel are dropped. A function,
    not a subclass: DeepSpeed's ZeRO accepts exactly the optimizer types it has tested."""
    def fused_adam_on_cpu(params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                          adam_w_mode=True, weight_decay=0.0, amsgrad=False,
                          set_grad_none=True):
        if not bias_correction or not adam_w_mode:
            raise ValueError("GPT-NeoX CPU mode replaces FusedAdam by torch's AdamW, which "
                             "has no bias_correction=False or adam_w_mode=False")
        return torch.optim.AdamW(params, lr=lr, betas=tuple(betas), eps=eps,
                                 weight_decay=weight_decay, amsgrad=amsgrad)

    return fused_adam_on_cpu


def _replace(owner: Any, name: str, value: Any, key: str) -> None:
    _state.originals.setdefault(key, getattr(owner, name, None))
    setattr(owner, name, value)


def apply(ranks_per_node: int) -> None:
    """Install every CPU-mode patch in this process (once); see the module docstring."""
    if _state.applied:
        return
    # deferred: deepspeed is slow to import; the rules and tests reading this module do not need it
    import deepspeed.ops.adam

    cuda = torch.cuda
    _state.ranks_per_node = max(1, int(ranks_per_node))
    _replace(cuda, "is_available", _is_available, "is_available")
    _replace(cuda, "device_count", _device_count, "device_count")
    _replace(cuda, "current_device", _current_device, "current_device")
    _replace(cuda, "set_device", _no_op("set_device"), "set_device")
    _replace(cuda, "synchronize", _no_op("synchronize"), "synchronize")
    _replace(cuda, "get_rng_state", _get_rng_state, "get_rng_state")
    _replace(cuda, "set_rng_state", _set_rng_state, "set_rng_state")
    for name in TYPED_TENSORS:
        _replace(cuda, name, getattr(torch, name), name)
    _replace(torch.Tensor, "cuda", _tensor_cuda, "Tensor.cuda")
    _replace(torch.cuda.nvtx, "range_push", _no_op("range_push"), "nvtx.range_push")
    _replace(torch.cuda.nvtx, "range_pop", _no_op("range_pop"), "nvtx.range_pop")
    _replace(deepspeed.ops.adam, "FusedAdam", _adamw_factory(), "FusedAdam")
    _state.applied = True


def wanted(device: str) -> bool:
    """CPU mode is for CPU clusters only: a GPU cluster's ranks are never patched."""
    return device == "cpu"


def ranks_per_node_from_env(default: int) -> int:
    """The entry's count of this node's ranks (RANKS_PER_NODE_ENV), else `default`."""
    value = os.environ.get(RANKS_PER_NODE_ENV)
    return int(value) if value else default
