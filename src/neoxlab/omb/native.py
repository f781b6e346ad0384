"""Build the native (C) reference benchmark against the MPI library mpi4py uses.

The pip ``mpich`` wheel installs mpicc, mpi.h and libmpi into the virtual environment
(beside ``python``), so the C program and mpi4py share one MPI library and one mpiexec.
mpicc is used when present; otherwise ``cc -I<prefix>/include -L<prefix>/lib -lmpi`` with
the headers and library found under the environment's prefix (and an rpath, so the binary
runs without LD_LIBRARY_PATH). Both need a C compiler (``cc``, or $MPICH_CC / $CC).

    python -m neoxlab.omb.native SOURCE OUTPUT   # rebuilds only when SOURCE is newer
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CFLAGS = ["-O2", "-Wall", "-Wextra"]


class NativeBuildError(RuntimeError):
    """The native benchmark cannot be built here; the message says what is missing."""


def env_prefix() -> Path:
    """The environment whose bin/ holds this python (and the wheel's mpicc and mpiexec)."""
    return Path(sys.executable).parent.parent


def c_compiler() -> str | None:
    """The C compiler mpicc would call ($MPICH_CC, $CC, cc, gcc, clang), or None."""
    for name in (os.environ.get("MPICH_CC"), os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _mpi_library(prefix: Path) -> tuple[Path, Path, str] | None:
    """(include dir, lib dir, -l flag) of an MPI installed under prefix, or None."""
    inc = prefix / "include"
    if not (inc / "mpi.h").exists():
        return None
    for libdir in (prefix / "lib", prefix / "lib64"):
        libs = sorted(libdir.glob("libmpi.so*"))
        if (libdir / "libmpi.so").exists():
            return inc, libdir, "-lmpi"
        if libs:
            return inc, libdir, f"-l:{libs[0].name}"
    return None


def compile_command(source: Path, output: Path) -> list[str]:
    """The command that builds source into output, or NativeBuildError saying why not."""
    cc = c_compiler()
    if cc is None:
        raise NativeBuildError("no C compiler found (tried $MPICH_CC, $CC, cc, gcc, clang); "
                               "install one, e.g. apt-get install gcc")
    prefix = env_prefix()
    mpicc = prefix / "bin" / "mpicc"
    if mpicc.exists():
        return [str(mpicc), *CFLAGS, "-o", str(output), str(source)]
    found = _mpi_library(prefix)
    if found is None:
        raise NativeBuildError(f"no mpicc, mpi.h or libmpi under {prefix}: the MPI library "
                               "comes from the pip 'mpich' wheel; run make install")
    inc, libdir, lib = found
    return [cc, *CFLAGS, f"-I{inc}", "-o", str(output), str(source), f"-L{libdir}",
            f"-Wl,-rpath,{libdir}", lib]


def build(source: Path, output: Path, force: bool = False) -> Path:
    """Compile source into output unless output is newer than source; returns output."""
    source, output = Path(source), Path(output)
    if not source.exists():
        raise NativeBuildError(f"native benchmark source {source} does not exist")
    if not force and output.exists() and output.stat().st_mtime >= source.stat().st_mtime:
        return output
    output.parent.mkdir(parents=True, exist_ok=True)
    cmd = compile_command(source, output)
    env = {**os.environ, "MPICH_CC": os.environ.get("MPICH_CC") or str(c_compiler())}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise NativeBuildError(f"compiling {source} failed ({' '.join(cmd)}):\n"
                               f"{proc.stderr.strip()}")
    return output


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m neoxlab.omb.native SOURCE OUTPUT", file=sys.stderr)
        return 2
    try:
        print(build(Path(args[0]), Path(args[1])))
    except NativeBuildError as exc:
        print(f"neoxlab.omb.native: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
