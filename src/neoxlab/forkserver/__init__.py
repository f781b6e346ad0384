"""Rank start-up from one process that imported the stack once (standard library only)."""
