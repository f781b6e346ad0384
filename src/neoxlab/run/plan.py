"""Freeze a validated config into a new run dir with everything a rank needs to start."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from neoxlab.config import Config, to_dict
from neoxlab.layout import estimate_memory, resolve_layout
from neoxlab.run import rundir


def plan_run(cfg: Config, argv: list[str] | None = None, root: Path | None = None) -> Path:
    """Validate (raises ConfigError with every problem), then write the run dir."""
    layout = resolve_layout(cfg)
    run_dir = rundir.create_run_dir(cfg, layout.dp, root)
    data = to_dict(cfg)
    rundir.write_json(run_dir / "config.json", data)
    rundir.write_atomic(run_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(data)))
    if cfg.task.name == "train" and cfg.engine.name == "builtin":
        from neoxlab.train.deepspeed_config import render

        rundir.write_json(run_dir / "deepspeed.json", render(cfg, layout))
    elif cfg.task.name == "train" and cfg.engine.name == "neox":
        from neoxlab.neox.render import write_neox_yml

        write_neox_yml(cfg, layout, run_dir)
    memory = estimate_memory(cfg, layout)
    rundir.write_json(
        run_dir / "layout.json",
        {
            "world_size": layout.world_size, "tp": layout.tp, "pp": layout.pp,
            "dp": layout.dp, "micro_batch": layout.micro_batch,
            "grad_accum": layout.grad_accum, "global_batch": layout.global_batch,
            "memory_estimate_gib": {
                "weights": memory.weights / 2**30, "gradients": memory.gradients / 2**30,
                "optimizer": memory.optimizer / 2**30, "activations": memory.activations / 2**30,
                "total": memory.total / 2**30,
            },
        },
    )
    rundir.write_json(run_dir / "provenance.json", rundir.provenance(layout.world_size, argv))
    rundir.set_status(run_dir, "planned")
    return run_dir
