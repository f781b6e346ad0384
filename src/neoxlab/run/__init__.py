"""A run's life: its directory and status (rundir), planning (plan), the per-rank frame
(rankjob, dist), resume and status reports."""
