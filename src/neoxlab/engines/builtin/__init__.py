"""Per-rank training program of the builtin engine."""
