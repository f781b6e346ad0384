"""Install neoxlab's compression patch into a GPT-NeoX process, before DeepSpeed initializes.

Two ways in, one install:
- neoxlab's entry (python -m neoxlab.engines.neox.entry) calls install_from_env() before it runs
  GPT-NeoX's train.py;
- the start-up shim (patches/neoxlab_shim/sitecustomize.py) calls arm() in any Python process
  started with NEOXLAB_RUN_DIR set, which installs the patch the moment `deepspeed` has been
  imported. GPT-NeoX imports DeepSpeed first thing (its argument module does), long before
  deepspeed.init_distributed creates the TorchBackend that caches torch.distributed
  functions, and it calls torch.distributed.<op> by attribute, so the wrappers are seen.
The hook waits for `deepspeed`, not torch: `import torch` itself imports torch.distributed,
and installing from inside a half-imported torch is fragile.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path

RUN_DIR_ENV = "NEOXLAB_RUN_DIR"


class _State:
    patch = None  # the installed CompressionPatch (None: not installed, or switched off)
    installed = False  # install_from_env has run to completion in this process
    busy = False  # an install is under way (deepspeed's import inside it re-enters)
    rows_written = False


_state = _State()


def current():
    """The CompressionPatch installed in this process, or None."""
    return _state.patch


def load_layout(run_dir: Path):
    """The frozen layout of a planned run (layout.json), without re-validating the config."""
    # deferred: the shim imports this module into every process; the rest waits for a run
    from neoxlab.layout import Layout
    from neoxlab.run.rundir import read_json

    data = read_json(run_dir / "layout.json")
    return Layout(data["world_size"], data["tp"], data["pp"], data["dp"], data["micro_batch"],
                  data["grad_accum"])


def install_from_env():
    """Install the run's patch once per process; a no-op without NEOXLAB_RUN_DIR."""
    value = os.environ.get(RUN_DIR_ENV)
    if not value or _state.installed or _state.busy:
        return _state.patch
    # deferred: the shim imports this module into every process; the rest waits for a run
    from neoxlab.comm.install import install_for_run
    from neoxlab.run.rundir import load_config

    _state.busy = True
    try:
        run_dir = Path(value)
        cfg, layout = load_config(run_dir), load_layout(run_dir)
        adapt(cfg, layout)
        _state.patch = install_for_run(cfg, layout)
        _state.installed = True
    finally:
        _state.busy = False
    if _state.patch is not None:
        atexit.register(write_rows)
    return _state.patch


def adapt(cfg, layout) -> None:
    """GPT-NeoX fitted to this process: our DeepSpeed's eval_batch (compat, everywhere) and,
    on a CPU cluster only, CPU mode (cpu_mode: torch.cuda patched; a GPU rank is untouched)."""
    # deferred: the shim imports this module into every process; the rest waits for a run
    from neoxlab.engines.neox import compat, cpu_mode

    compat.apply()
    if cpu_mode.wanted(cfg.cluster.device):
        cpu_mode.apply(cpu_mode.ranks_per_node_from_env(
            min(cfg.cluster.ranks_per_node, layout.world_size)))


def write_rows(rank: int | None = None) -> Path | None:
    """This rank's accounting -> run_dir/logs/comm.rank<N>.json (once; also at exit)."""
    if _state.patch is None or _state.rows_written:
        return None
    # deferred: the shim imports this module into every process; the rest waits for a run
    from neoxlab.comm.records import write_rank_rows

    if rank is None:
        rank = int(os.environ.get("RANK", "0"))
    run_dir = Path(os.environ[RUN_DIR_ENV])
    write_rank_rows(run_dir, rank, _state.patch.accountant)
    _state.rows_written = True
    return run_dir / "logs" / f"comm.rank{rank}.json"


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback right after one module has been executed (a one-shot import hook)."""

    def __init__(self, name: str, callback):
        self.name, self.callback, self.searching = name, callback, False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self.searching:
            return None
        self.searching = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.searching = False
        if spec is None or spec.loader is None:
            return None
        sys.meta_path.remove(self)
        spec.loader = _CallbackLoader(spec.loader, self.callback)
        return spec


class _CallbackLoader(importlib.abc.Loader):
    """The real loader, then the callback; the module keeps the real loader afterwards."""

    def __init__(self, loader, callback):
        self.loader, self.callback = loader, callback

    def __getattr__(self, name):  # get_resource_reader, is_package, ...: the real loader's
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.callback()


def after_import(module: str, callback) -> None:
    """Call `callback()` once `module` has been imported (now, if it already is)."""
    if module in sys.modules:
        callback()
    elif not any(isinstance(f, _AfterImport) and f.name == module for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(module, callback))


def arm(module: str = "deepspeed") -> None:
    """Install the patch as soon as `module` is imported (now, if it already is)."""
    if os.environ.get(RUN_DIR_ENV):
        after_import(module, install_from_env)
