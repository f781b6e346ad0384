"""Temporal-fusion inference (Flover) on the GPT-NeoX model, and its baselines.

Import-light: `validate_serve` is imported by the layout checks before anything starts.
"""

from neoxlab.serve.rules import check_serve, validate_serve

__all__ = ["check_serve", "validate_serve"]
