#!/bin/sh
# One rank of an emulated cluster, in its own network namespace <prefix>-<node>r<local rank>:
#   netns_rank.sh <prefix> <command...>
# Started by hydra: the node comes from netns_proxy.sh, the local rank from MPI_LOCALRANKID.
# Started by srun (cluster.launcher=srun): slurmd runs in the node's namespace, and Slurm
# names the node (SLURMD_NODENAME) and the local rank (SLURM_LOCALID).
prefix=$1
shift
node=${NEOXLAB_EMU_NODE:-${SLURMD_NODENAME:?not started by netns_proxy.sh or srun}}
local_rank=${MPI_LOCALRANKID:-${SLURM_LOCALID:?not started by hydra or srun}}
exec ip netns exec "$prefix-${node}r${local_rank}" "$@"
