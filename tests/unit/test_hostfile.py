"""Hostfiles from LSF and Slurm job variables (the launch node is not a compute host)."""

from __future__ import annotations

import pytest

from neoxlab.launch.hostfile import format_hostfile, lsf_hosts


def test_lsf_djob_hostfile_skips_the_launch_node(tmp_path):
    listed = tmp_path / "hosts"
    listed.write_text("batch3\n" + "lassen7\n" * 40 + "lassen8\n" * 40)
    assert lsf_hosts({"LSB_DJOB_HOSTFILE": str(listed)}) == ["lassen7", "lassen8"]


def test_lsf_mcpu_hosts_skips_the_launch_node():
    assert lsf_hosts({"LSB_MCPU_HOSTS": "batch3 1 lassen7 40 lassen8 40"}) == [
        "lassen7", "lassen8"]


def test_single_host_job_keeps_its_host():
    assert lsf_hosts({"LSB_MCPU_HOSTS": "node1 4"}) == ["node1"]


def test_outside_a_job_is_an_error():
    with pytest.raises(RuntimeError, match="LSB_DJOB_HOSTFILE"):
        lsf_hosts({})


def test_deepspeed_format():
    assert format_hostfile(["a", "b"], 4) == "a slots=4\nb slots=4\n"
