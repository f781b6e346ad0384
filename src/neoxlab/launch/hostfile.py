"""The job's compute hosts as a DeepSpeed-style hostfile (`host slots=N`), for tools that
want one; our own ranks find each other through MPI and do not need it."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping


def lsf_hosts(env: Mapping[str, str]) -> list[str]:
    """Compute hosts of an LSF job, in order, without the launch (batch) node.

    LSB_DJOB_HOSTFILE has one line per slot and LSB_MCPU_HOSTS is 'host n host n ...';
    on both the first host is the launch node, which has no GPUs."""
    path = env.get("LSB_DJOB_HOSTFILE")
    if path:
        with open(path) as f:
            listed = [line.strip() for line in f if line.strip()]
    else:
        listed = env.get("LSB_MCPU_HOSTS", "").split()[0::2]
    if not listed:
        raise RuntimeError("neither LSB_DJOB_HOSTFILE nor LSB_MCPU_HOSTS is set: not in an LSF job")
    return _unique(listed[1:] if len(set(listed)) > 1 else listed)


def slurm_hosts(env: Mapping[str, str]) -> list[str]:
    nodelist = env.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise RuntimeError("SLURM_JOB_NODELIST is not set: not in a Slurm job")
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                         text=True, timeout=60, check=True)
    return _unique(out.stdout.split())


def format_hostfile(hosts: list[str], slots: int) -> str:
    return "".join(f"{host} slots={slots}\n" for host in hosts)


def _unique(hosts: list[str]) -> list[str]:
    return list(dict.fromkeys(hosts))
