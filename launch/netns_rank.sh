#!/bin/sh
# One rank of an emulated cluster, in its own network namespace <prefix>-<node>r<local rank>:
#   netns_rank.sh <prefix> <command...>
# The node comes from netns_proxy.sh, the local rank from hydra (MPI_LOCALRANKID).
prefix=$1
shift
exec ip netns exec "$prefix-${NEOXLAB_EMU_NODE:?not started by netns_proxy.sh}r${MPI_LOCALRANKID:?not started by hydra}" "$@"
