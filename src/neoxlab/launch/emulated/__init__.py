"""The emulated cluster's launcher: the nodes' network namespaces, bridges and shaped links
(topology, cluster), its own multi-node Slurm (slurm) and the job across its nodes (launch).
Its config is config/emulated.py, its performance model perfmodel/emulated.py, its wire
model perfmodel/wire.py, its sweep studies/sweep_runs.py and studies/sweep_points.py."""
