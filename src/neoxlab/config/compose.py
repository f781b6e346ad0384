"""Compose an experiment from configs/ building blocks and its experiments/<name>.yaml overlay."""

from __future__ import annotations

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import OmegaConf

from neoxlab.config import Config, ConfigError, to_structured
from neoxlab.config.schema import old_key_error
from neoxlab.files import REPO_ROOT

# The schema is the base of configs/config.yaml, so overrides of any schema field work even
# when no YAML file sets it, and unknown keys fail during composition.
ConfigStore.instance().store(name="neoxlab_schema", node=Config)

CONFIG_DIR = REPO_ROOT / "configs"
EXPERIMENT_DIR = REPO_ROOT / "experiments"


def list_experiments() -> list[str]:
    return sorted(p.stem for p in EXPERIMENT_DIR.glob("*.yaml"))


def compose_experiment(name: str, overrides: list[str] | None = None) -> Config:
    """Hydra composition + schema merge; errors name the experiment or the bad override."""
    if name not in list_experiments():
        raise ConfigError(
            f"unknown experiment '{name}': no experiments/{name}.yaml; choose one of "
            f"{list_experiments()}"
        )
    for override in overrides or []:
        old = old_key_error(override.split("=", 1)[0].lstrip("+~"))
        if old is not None:
            raise old
    args = [f"hydra.searchpath=[file://{REPO_ROOT}]", f"+experiments={name}", *(overrides or [])]
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            raw = compose(config_name="config", overrides=args)
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"a YAML file of experiment '{name}' does not parse: {exc}; quote values that "
            "contain ': ' or start with special characters"
        ) from None
    except HydraException as exc:
        cause = f" ({exc.__cause__})" if exc.__cause__ else ""
        raise ConfigError(
            f"cannot compose experiment '{name}' with overrides {overrides or []}: {exc}{cause}; "
            "check the override keys (key=value, +key=value to add) and config group names"
        ) from None
    container = OmegaConf.to_container(raw, resolve=True)
    container.pop("experiments", None)  # hydra records the group selection; not a field
    return to_structured(container)
