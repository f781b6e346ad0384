"""neoxlab's start-up shim for GPT-NeoX processes (first on PYTHONPATH; see patches/README.md).

Python imports `sitecustomize` at start-up. With NEOXLAB_RUN_DIR set, this arms neoxlab's
compression patch: it is installed right after the process imports `deepspeed`, before
DeepSpeed initializes. Without NEOXLAB_RUN_DIR it does nothing. Either way, the
environment's own sitecustomize (which this file shadows) still runs.
"""

import os
import sys


def _arm() -> None:
    if not os.environ.get("NEOXLAB_RUN_DIR"):
        return
    try:
        from neoxlab.engines.neox.inject import arm
    except ImportError as exc:
        print(
            f"[neoxlab shim] NEOXLAB_RUN_DIR is set but neoxlab cannot be imported ({exc}): "
            "this process runs WITHOUT the compression patch; put <neoxlab>/src on PYTHONPATH",
            file=sys.stderr, flush=True,
        )
        return
    arm()


def _chain() -> None:
    """Run the next sitecustomize on sys.path, the one this file hides."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_arm()
_chain()
