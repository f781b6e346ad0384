"""What the job script starts on every rank for engine=neox (no deepy.py, no DeepSpeed runner).

jsrun/srun start `rank_command(...)` with `rank_env(...)` exported on each rank; the entry
discovers the rank through MPI, installs the compression patch and runs GPT-NeoX's train.py
with the arguments deepy.py would have passed.
"""

from __future__ import annotations

from pathlib import Path

from neoxlab.config import Config, ConfigError
from neoxlab.files import REPO_ROOT

PATCH_DIR = REPO_ROOT / "patches"
SHIM_DIR = PATCH_DIR / "neoxlab_shim"
LOCK_FILE = PATCH_DIR / "upstream.lock"
ENTRY_MODULE = "neoxlab.engines.neox.entry"


def checkout_dir(cfg: Config) -> Path:
    """cluster.neox_dir as an absolute path; a relative one is under this checkout of neoxlab
    (e.g. build/gpt-neox, where `make neox-checkout` unpacks the vendored GPT-NeoX)."""
    path = Path(str(cfg.cluster.neox_dir)).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path


def rank_command(cfg: Config, run_dir: Path, python: str) -> list[str]:
    """argv of one rank: `<python> -m neoxlab.engines.neox.entry <run_dir>`."""
    return [python, "-m", ENTRY_MODULE, str(Path(run_dir).resolve())]


def rank_env(cfg: Config, run_dir: Path) -> dict[str, str]:
    """Variables every rank needs; the job script exports them before jsrun/srun.

    PYTHONPATH: the start-up shim first (its sitecustomize arms the patch), then neoxlab's
    sources, then the GPT-NeoX checkout (train.py imports `megatron` from its root). A site
    PYTHONPATH, if any, belongs after these.
    """
    if cfg.cluster.neox_dir is None:
        raise ConfigError(
            "engine=neox needs the GPT-NeoX checkout: cluster.neox_dir is not set; add "
            "cluster.neox_dir=/path/to/gpt-neox"
        )
    parts = [SHIM_DIR, REPO_ROOT / "src", checkout_dir(cfg)]
    env = {
        "PYTHONPATH": ":".join(str(p) for p in parts),
        "NEOXLAB_RUN_DIR": str(Path(run_dir).resolve()),
        "PYTHONUNBUFFERED": "1",  # rank logs stream, so a killed job keeps its last steps
        "OMP_NUM_THREADS": str(cfg.engine.torch_threads),
    }
    if cfg.cluster.device == "cpu":  # CPU mode (cpu_mode.py): DeepSpeed's CPU accelerator
        env["DS_ACCELERATOR"] = "cpu"
    return env


def read_lock(path: Path = LOCK_FILE) -> dict[str, str]:
    """patches/upstream.lock: `key = value` lines; `#` starts a comment."""
    values = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            key, sep, value = line.partition("=")
            if not sep:
                raise ValueError(f"{path}: '{line}' is not 'key = value'")
            values[key.strip()] = value.strip()
    return values
