"""GPT-NeoX's C++ dataset helpers (megatron/data/helpers.cpp), built with the job's python.

megatron/data/Makefile takes pybind11's include flags from `python3 -m pybind11` and the
module suffix from `python3-config`, i.e. whatever python3 is first on PATH - on a cluster
often the system python, without pybind11 and of another version, so the build fails or
produces a module the job's python cannot import. GPT-NeoX also re-runs that `make` on every
rank whose LOCAL_RANK is 0 (all of them with one GPU per rank), in a checkout every node shares.

So the entry puts a `python3` that runs the job's own interpreter first on PATH, and passes
the module suffix as a command-line make variable (through MAKEFLAGS, which GPT-NeoX's own
make calls inherit): rank 0 builds once, and every later make finds the module up to date.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
import sysconfig
from collections.abc import MutableMapping
from pathlib import Path

WRAPPER_DIR = "bin"  # in the run dir: bin/python3 -> the job's python


def make_variables() -> dict[str, str]:
    """What the makefile would ask python3-config for, from the job's interpreter."""
    return {"LIBEXT": sysconfig.get_config_var("EXT_SUFFIX")}


def python_wrapper(run_dir: Path, python: str = sys.executable) -> Path:
    """run_dir/bin/python3, a script that execs the job's python (a symlink would lose the
    venv: python finds pyvenv.cfg next to the path it was started as)."""
    path = Path(run_dir) / WRAPPER_DIR / "python3"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f'#!/bin/sh\nexec {shlex.quote(python)} "$@"\n')
    tmp.chmod(0o755)
    tmp.replace(path)
    return path


def build_environment(run_dir: Path, environ: MutableMapping[str, str] | None = None) -> None:
    """PATH and MAKEFLAGS for every make of megatron/data in this process and its children."""
    env = os.environ if environ is None else environ
    bin_dir = str(Path(run_dir) / WRAPPER_DIR)
    if env.get("PATH", "").split(os.pathsep)[0] != bin_dir:
        env["PATH"] = os.pathsep.join(filter(None, [bin_dir, env.get("PATH")]))
    flags = env.get("MAKEFLAGS", "").split()
    flags += [f"{key}={value}" for key, value in make_variables().items()
              if f"{key}={value}" not in flags]
    env["MAKEFLAGS"] = " ".join(flags)


def missing_pybind11_error() -> str | None:
    if importlib.util.find_spec("pybind11") is not None:
        return None
    return (f"GPT-NeoX's dataset helpers need pybind11, which the job's python "
            f"({sys.executable}) cannot import; install neoxlab's GPT-NeoX extra into that "
            "environment (pip install -e '.[neox]', or make neox-env)")


def build_data_helpers(neox_dir: Path, run_dir: Path) -> None:
    """Rank 0, before any rank starts train.py: make -C <neox_dir>/megatron/data."""
    data = Path(neox_dir) / "megatron" / "data"
    if not (data / "Makefile").exists():
        return
    problem = "pybind11" in (data / "Makefile").read_text() and missing_pybind11_error()
    if problem:
        raise RuntimeError(problem)
    python_wrapper(run_dir)
    env = dict(os.environ)
    build_environment(run_dir, env)
    proc = subprocess.run(["make", "-C", str(data)], capture_output=True, text=True,
                          check=False, env=env)
    if proc.returncode != 0:
        raise RuntimeError(
            f"building GPT-NeoX's dataset helpers (make -C {data}) with {sys.executable} "
            f"failed: {(proc.stdout + proc.stderr).strip()[-2000:]}; GPT-NeoX needs a C++ "
            "compiler (module load gcc) and pybind11 in the job's environment"
        )
