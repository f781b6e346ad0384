"""Compile nvrtc_codecs.cu with NVRTC (ctypes, no host compiler, no torch headers).

NVRTC needs no GPU: it turns CUDA C into PTX for a named architecture on any machine, so
CI compiles the device source for sm_70 with NVRTC 11.8 (Lassen's CUDA) and for sm_90
with NVRTC 12.x. The library is found, in order, at NEOXLAB_NVRTC_LIB (a path to
libnvrtc.so.*), in the pip wheels nvidia-cuda-nvrtc-cu12 / -cu11 (installed normally or
with ``make nvrtc`` into build/nvrtc/cu11|cu12: both wheels use the same directory
nvidia/cuda_nvrtc/lib, so the Makefile keeps them apart with ``pip --target``; CUDA 13's
wheel uses nvidia/cu13/lib), under
CUDA_HOME / CUDA_PATH (a site's CUDA module), then by the loader's search path.

PTX, not cubin: the driver of any newer GPU JIT-compiles PTX of an older target, and an
NVRTC older than the driver still produces PTX the driver accepts. Results are cached
per (source hash, architecture, NVRTC version) under NEOXLAB_CACHE_DIR (default
~/.cache/neoxlab/nvrtc), so each process compiles a given arch at most once, and a
home directory shared by nodes compiles once per arch.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import importlib.util
import os
import sys
import tempfile
from functools import cache
from pathlib import Path

SOURCE = Path(__file__).with_name("nvrtc_codecs.cu")
# IEEE rounding as on the host build: no fused multiply-add, exact division
OPTIONS = ("--fmad=false", "--prec-div=true", "--prec-sqrt=true", "-default-device")
_REPO = Path(__file__).resolve().parents[3]


class NvrtcError(RuntimeError):
    """NVRTC is missing or the source did not compile (the message holds NVRTC's log)."""


def cache_dir() -> Path:
    root = os.environ.get("NEOXLAB_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "neoxlab")
    return Path(root)


def torch_file() -> str | None:
    spec = importlib.util.find_spec("torch")
    return spec.origin if spec is not None else None


def candidates() -> list[str]:
    """Where libnvrtc may be, in the order they are tried (module doc; also torch's
    own lib directory, for builds that bundle it)."""
    found: list[str] = []
    if os.environ.get("NEOXLAB_NVRTC_LIB"):
        found.append(os.environ["NEOXLAB_NVRTC_LIB"])
    for root in sys.path:  # pip wheels: nvidia/cuda_nvrtc/lib (CUDA 11/12), nvidia/cu13/lib
        if root and os.path.isdir(os.path.join(root, "nvidia")):
            found += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnvrtc.so.*")),
                            reverse=True)
    torch_lib = os.path.join(os.path.dirname(torch_file()), "lib") if torch_file() else None
    if torch_lib:  # builds that bundle their own libnvrtc
        found += sorted(glob.glob(os.path.join(torch_lib, "libnvrtc*.so*")))
    for tag in ("cu12", "cu11"):
        found += sorted(glob.glob(str(_REPO / "build" / "nvrtc" / tag / "nvidia" / "cuda_nvrtc"
                                      / "lib" / "libnvrtc.so.*")))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            found += sorted(glob.glob(os.path.join(os.environ[var], "lib64", "libnvrtc.so*")))
    found.append("libnvrtc.so")
    return [f for f in found if "builtins" not in f and ".alt." not in f]


class Nvrtc:
    """One loaded libnvrtc: version and compile()."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lib = ctypes.CDLL(path)
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "version")
        self.version = (major.value, minor.value)

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise NvrtcError(f"nvrtc {what} failed: {self.lib.nvrtcGetErrorString(rc).decode()}")

    def compile(self, source: str, arch: str, name: str = "nvrtc_codecs.cu") -> bytes:
        """PTX of source for arch (e.g. 'sm_70'); NvrtcError with NVRTC's log on failure."""
        prog = ctypes.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(),
                                                name.encode(), 0, None, None), "create")
        try:
            opts = [f"--gpu-architecture=compute_{arch.removeprefix('sm_')}".encode(),
                    *(o.encode() for o in OPTIONS)]
            argv = (ctypes.c_char_p * len(opts))(*opts)
            rc = self.lib.nvrtcCompileProgram(prog, len(opts), argv)
            size = ctypes.c_size_t()
            self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            self.lib.nvrtcGetProgramLog(prog, log)
            if rc != 0:
                raise NvrtcError(f"NVRTC {self.version[0]}.{self.version[1]} ({self.path}) "
                                 f"could not compile {name} for {arch}:\n"
                                 f"{log.value.decode(errors='replace')}")
            self._check(self.lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "ptx size")
            ptx = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetPTX(prog, ptx), "ptx")
            return ptx.raw.rstrip(b"\0") + b"\0"
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


def load(path: str | None = None) -> Nvrtc:
    """libnvrtc at path, or the first of candidates() that loads."""
    if path is not None:
        return Nvrtc(path)
    return _first()


@cache
def _first() -> Nvrtc:
    errors = []
    for cand in candidates():
        try:
            return Nvrtc(cand)
        except OSError as err:
            errors.append(f"{cand}: {err}")
    raise NvrtcError("no libnvrtc found (tried " + "; ".join(errors[-3:]) + "); install "
                     "nvidia-cuda-nvrtc-cu12 (or -cu11 for CUDA 11), load the site's CUDA "
                     "module, or set NEOXLAB_NVRTC_LIB=/path/to/libnvrtc.so")


def available() -> bool:
    try:
        _first()
    except NvrtcError:
        return False
    return True


def ptx(arch: str, nvrtc: Nvrtc | None = None) -> bytes:
    """The codecs' PTX for arch, compiled once and cached on disk (module doc)."""
    nv = nvrtc or _first()
    text = SOURCE.read_text()
    key = hashlib.sha256((text + repr(OPTIONS)).encode()).hexdigest()[:16]
    path = cache_dir() / "nvrtc" / f"codecs-{key}-{arch}-nvrtc{nv.version[0]}.{nv.version[1]}.ptx"
    if path.is_file():
        return path.read_bytes()
    out = nv.compile(text, arch)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:
        tmp.write(out)  # written whole, then renamed: a concurrent rank never reads half
    os.replace(tmp.name, path)
    return out
