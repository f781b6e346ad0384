"""GPT-NeoX adapted to the DeepSpeed we pin (upstream), where the two disagree.

GPT-NeoX is written against EleutherAI's DeepSpeed fork (DeeperSpeed, patches/upstream.lock).
One difference breaks its training loop on upstream DeepSpeed, on GPUs as on CPUs:

- `PipelineEngine.eval_batch(data_iter)` returns the mean loss upstream, while GPT-NeoX's
  evaluation (megatron/training.py, `loss, metric_dict = forward_step_fn(...)`, which returns
  `model.eval_batch(...)` for pipelines) unpacks `(loss, metrics)` as the fork returns it. Any
  pipelined run with evaluation (eval_iters > 0) crashed at its first evaluation. With
  `return_logits=True` both return `(loss, logits)`, which GPT-NeoX expects there.

`apply()` wraps eval_batch once per process; inject.install_from_env calls it on every
engine=neox rank, CPU or GPU.
"""

from __future__ import annotations

import functools
from typing import Any

_MARK = "_neoxlab_returns_metrics"


def eval_batch_with_metrics(eval_batch):
    """eval_batch returning `(loss, {})` where upstream returns the loss alone."""

    @functools.wraps(eval_batch)
    def wrapped(self, data_iter, return_logits: bool = False, *args: Any, **kwargs: Any):
        out = eval_batch(self, data_iter, return_logits, *args, **kwargs)
        return out if return_logits else (out, {})

    setattr(wrapped, _MARK, True)
    return wrapped


def apply() -> None:
    """Wrap DeepSpeed's PipelineEngine.eval_batch (once)."""
    # deferred: deepspeed is slow to import; the rules and tests reading this module do not need it
    from deepspeed.runtime.pipe.engine import PipelineEngine

    if not getattr(PipelineEngine.eval_batch, _MARK, False):
        PipelineEngine.eval_batch = eval_batch_with_metrics(PipelineEngine.eval_batch)
