"""engine=neox: a user's GPT-NeoX checkout run on ranks started by jsrun/srun (no deepy.py).

render   our config -> neox.yml (GPT-NeoX's argument names), written at planning
validate engine=neox's rules (pure), and the pre-submit file checks
launch   each rank's command and environment for the job script
entry    `python -m neoxlab.neox.entry <run_dir>`: the per-rank program
inject   the compression patch inside the GPT-NeoX process (also via patches/neoxlab_shim)
metrics  rank logs -> metrics.jsonl + summary.json after the job

Names are imported on first use: the start-up shim imports neoxlab.neox.inject in every
process of the job, which should not pay for the rest.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "render_neox_config": "render", "write_neox_yml": "render",
    "validate_neox": "validate", "check_neox_dir": "validate", "check_neox_inputs": "validate",
    "rank_command": "launch", "rank_env": "launch", "collect_metrics": "metrics",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'neoxlab.neox' has no attribute '{name}'")
    return getattr(importlib.import_module(f"neoxlab.neox.{_EXPORTS[name]}"), name)
