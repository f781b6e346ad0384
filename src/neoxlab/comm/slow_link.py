"""A testing stand-in for a slower link, for ranks whose real link cannot be reshaped (plain
CPU ranks on one machine): once switched on, every collective the compression patch runs
first sleeps in proportion to the largest tensor it touches, inside the call the patch
times, so the accounting measures a link that got slower. compression.auto.slow_link_*
switches it on at a step; the emulated cluster reshapes its real uplinks instead
(launch.emulated.cluster.reshape_uplinks)."""

from __future__ import annotations

import functools
import time

import torch


class SlowLink:
    def __init__(self, s_per_mb: float):
        self.s_per_byte = s_per_mb / 1e6
        self.active = False  # set by the training loop at the configured step, on every rank

    def wrap(self, original):
        """`original` slowed by the stand-in while it is active."""
        link = self

        @functools.wraps(original)
        def slowed(*args, **kwargs):
            if link.active:
                time.sleep(_largest_bytes(args, kwargs.values()) * link.s_per_byte)
            return original(*args, **kwargs)

        return slowed


def _largest_bytes(*groups) -> int:
    sizes = [v.numel() * v.element_size() for g in groups for v in g
             if isinstance(v, torch.Tensor)]
    return max(sizes, default=0)
