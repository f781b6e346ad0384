"""Install the compression patch for a run, before DeepSpeed initializes."""

from __future__ import annotations

from neoxlab.comm.classify import Classifier, Grid
from neoxlab.comm.patch import CompressionPatch
from neoxlab.comm.policy import build_policies
from neoxlab.comm.strict import strict_from_env
from neoxlab.config import Config
from neoxlab.layout import Layout


def install_for_run(cfg: Config, layout: Layout) -> CompressionPatch | None:
    """The framework patch (None when compression.patch is off or the MPI library does it)."""
    c = cfg.compression
    if not c.patch or c.backend != "framework":
        return None
    classifier = Classifier(Grid(tp=layout.tp, pp=layout.pp, dp=layout.dp),
                            hidden_size=cfg.model.hidden_size)
    return CompressionPatch(build_policies(c), classifier, c.allreduce,
                            strict_from_env()).install()
