"""A run's life on disk and on its ranks: its directory and status.json (rundir), the per-rank
frame (rankjob, dist) and progress lines."""
