"""An emulated multi-node cluster on one machine, in one package: its config (config), the
nodes' network namespaces, bridges and shaped links (topology, cluster, wire), its own
multi-node Slurm (slurm), the launch across its nodes (launch), its performance model (model)
and the bandwidth sweep's measurements (sweep)."""
