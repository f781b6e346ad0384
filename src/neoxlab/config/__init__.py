"""The configuration layer: the schema (schema.py), Hydra composition (compose.py) and the one
place every rule runs (check.py). The schema's names are importable from here; compose and
check are imported by their full names (check sits above every rule module)."""

from neoxlab.config.schema import (
    COMPRESSIBLE_DIMS,
    DIMS,
    ClusterConfig,
    CompressionConfig,
    Config,
    ConfigError,
    DataConfig,
    Dim,
    DimCompressionConfig,
    EngineConfig,
    LaunchConfig,
    LoggerConfig,
    ModelConfig,
    OmbConfig,
    ParallelConfig,
    ServeConfig,
    TaskConfig,
    TrainConfig,
    TuneConfig,
    ZeroConfig,
    from_dict,
    to_dict,
    to_structured,
)

__all__ = [
    "COMPRESSIBLE_DIMS", "DIMS", "Dim",
    "ClusterConfig", "CompressionConfig", "Config", "ConfigError", "DataConfig",
    "DimCompressionConfig", "EngineConfig", "LaunchConfig", "LoggerConfig", "OmbConfig",
    "ModelConfig", "ParallelConfig", "ServeConfig", "TaskConfig", "TrainConfig", "TuneConfig",
    "ZeroConfig",
    "from_dict", "to_dict", "to_structured",
]
