"""The GPT-NeoX checkout the engine=neox tests run: NEOXLAB_TEST_NEOX_DIR if set, else the
vendored tarball (../shared/vendor/gpt-neox-<commit>.tar.gz beside the repo, as CI copies it)
unpacked once into the git-ignored build/gpt-neox, where `make neox-checkout` puts it too.
Without either, or without the `[neox]` extra, the tests skip and say why."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import tarfile
from pathlib import Path

from neoxlab.engines.neox.launch import read_lock
from tests.conftest import REPO_ROOT

COMMIT = read_lock()["gpt_neox_commit"]
TARBALL = REPO_ROOT.parent / "shared" / "vendor" / f"gpt-neox-{COMMIT[:8]}.tar.gz"
UNPACKED = REPO_ROOT / "build" / "gpt-neox"
STAMP = UNPACKED / ".neoxlab-unpacked"  # written last: its presence means complete
EXTRAS = ("pkg_resources", "sentencepiece", "pybind11")


def missing_extras() -> list[str]:
    return [m for m in EXTRAS if importlib.util.find_spec(m) is None]


def unpack(tarball: Path = TARBALL, target: Path = UNPACKED) -> Path:
    """Unpack the tarball (its top folder is gpt-neox/) into target, once, under a lock."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".gpt-neox.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = target / STAMP.name
        if stamp.is_file() and stamp.read_text() == tarball.name:
            return target
        scratch = target.parent / ".gpt-neox.unpacking"
        shutil.rmtree(scratch, ignore_errors=True)
        with tarfile.open(tarball) as archive:
            archive.extractall(scratch, filter="data")
        shutil.rmtree(target, ignore_errors=True)
        (scratch / "gpt-neox").rename(target)
        shutil.rmtree(scratch, ignore_errors=True)
        stamp.write_text(tarball.name)
    return target


def checkout() -> tuple[Path | None, str]:
    """(the checkout, "") or (None, why the engine=neox tests skip)."""
    missing = missing_extras()
    if missing:
        return None, (f"GPT-NeoX needs {missing}: pip install -e '.[neox]' (make neox-env; "
                      "setuptools 81+ has no pkg_resources)")
    given = os.environ.get("NEOXLAB_TEST_NEOX_DIR")
    if given:
        return Path(given).resolve(), ""
    if not TARBALL.is_file():
        return None, (f"no GPT-NeoX checkout: {TARBALL} is absent (CI copies ../shared beside "
                      "the clone) and NEOXLAB_TEST_NEOX_DIR is not set")
    return unpack(), ""
