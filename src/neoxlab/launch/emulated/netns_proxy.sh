#!/bin/sh
# MPICH hydra's "ssh" on an emulated cluster (neoxlab.launch.emulated.launch):
#   netns_proxy.sh [-x ...] <node> <proxy command>
# The proxy stays on this machine's own network (it talks to mpiexec); it only learns which
# emulated node it stands for, and its ranks enter their namespaces with netns_rank.sh.
while [ "${1#-}" != "$1" ]; do shift; done
NEOXLAB_EMU_NODE=$1
export NEOXLAB_EMU_NODE
shift
exec sh -c "$*"
