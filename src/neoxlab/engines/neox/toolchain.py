"""Can the cluster's compilers build GPT-NeoX's fused kernels for the installed torch?

GPT-NeoX JIT-compiles its C++/CUDA kernels (megatron/fused_kernels) through
torch.utils.cpp_extension on every rank at start-up, when any of FUSED_KERNEL_ARGS is on.
torch passes its own C++ standard to both the host compiler and nvcc (torch 2.13: -std=c++20),
and old compilers reject it before anything is built, on every rank. The toolchain is read
from cluster.modules (`gcc/8.3.1`, `cuda/11.8.0`); a cluster that names neither is unknown
and not judged.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

# GPT-NeoX arguments that make megatron/initialize.py call fused_kernels.load() (C++/CUDA).
# bias_gelu_fusion is TorchScript (no host compiler), so it is not among them.
FUSED_KERNEL_ARGS = (
    "scaled_upper_triang_masked_softmax_fusion",
    "scaled_masked_softmax_fusion",
    "rope_fusion",
)
# The oldest gcc and CUDA (nvcc) that accept each standard's -std flag.
MINIMUM = {"c++17": {"gcc": (7, 0), "cuda": (11, 0)}, "c++20": {"gcc": (10, 0), "cuda": (12, 0)}}
PINNED_TORCH_STANDARD = "c++20"  # torch 2.13.0 (pyproject.toml), read in cpp_extension.py
_MODULE = re.compile(r"^(gcc|cuda)/(\d+)(?:\.(\d+))?", re.IGNORECASE)


def torch_cxx_standard() -> str:
    """The -std flag the installed torch's cpp_extension passes, read from its source
    without importing torch (validation stays cheap); the pinned torch's if none is found."""
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        source = Path(spec.origin).parent / "utils" / "cpp_extension.py"
        if source.is_file():
            text = source.read_text(errors="replace")
            for standard in ("c++20", "c++17"):
                if f"-std={standard}" in text:
                    return standard
    return PINNED_TORCH_STANDARD


def module_versions(modules: list[str]) -> dict[str, tuple[int, int]]:
    """{'gcc': (8, 3), 'cuda': (11, 8)} from module names like gcc/8.3.1 and cuda/11.8.0."""
    found = {}
    for name in modules:
        match = _MODULE.match(str(name))
        if match:
            found[match.group(1).lower()] = (int(match.group(2)), int(match.group(3) or 0))
    return found


def toolchain_problem(modules: list[str], standard: str | None = None) -> str | None:
    """Why these modules cannot build the fused kernels (None: they can, or are unknown)."""
    standard = standard or torch_cxx_standard()
    have = module_versions(modules)
    too_old = [
        f"{tool} {'.'.join(map(str, have[tool]))} (needs >= {'.'.join(map(str, least))})"
        for tool, least in MINIMUM[standard].items() if tool in have and have[tool] < least
    ]
    if not too_old:
        return None
    return (f"the installed torch compiles extensions with -std={standard}, which "
            f"{' and '.join(too_old)} reject")


def fused_kernels_default(modules: list[str]) -> bool:
    """The default of FUSED_KERNEL_ARGS in neox.yml: on (as the published 20B config) unless
    the cluster's modules are known to be unable to compile them."""
    return toolchain_problem(modules) is None
