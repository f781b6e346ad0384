"""The PMI relay in front of each srun rank: MPICH is told values short enough for Slurm's
pmi2 plugin to read every line whole, lines pass only whole, and the rank's end passes
through."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading

from neoxlab.launch import pmi_relay

MAXES = b"cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=1024\n"


def test_only_the_maxes_reply_changes_and_only_downwards():
    assert pmi_relay.smaller_values(MAXES) == \
        b"cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=512\n"
    already_small = b"cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=100\n"
    assert pmi_relay.smaller_values(already_small) == already_small
    other = b"cmd=get_result rc=0 value=vallen_max=1024\n"
    assert pmi_relay.smaller_values(other) == other


def _relayed() -> tuple[socket.socket, socket.socket]:
    """(the PMI server's end, the rank's end) with a relay between them."""
    server, server_side = socket.socketpair()
    rank, rank_side = socket.socketpair()
    threading.Thread(target=pmi_relay.relay, args=(server_side, rank_side), daemon=True).start()
    for sock in (server, rank):
        sock.settimeout(30)
    return server, rank


def _read_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        data += sock.recv(4096)
    return data


def test_a_line_written_in_pieces_reaches_the_server_only_whole():
    server, rank = _relayed()
    put = b"cmd=put kvsname=1.0 key=-allgather-1-0-seg-1/9 value=" + b"AB" * 400 + b"\n"
    rank.sendall(put[:300])
    # two round trips through the relay: the first one's select saw the piece waiting too,
    # so by the second the relay has read it, and would have forwarded it by now
    for ping in (b"cmd=ping\n", b"cmd=ping2\n"):
        server.sendall(ping)
        assert _read_line(rank) == ping
    server.setblocking(False)
    try:
        early = server.recv(4096)
    except BlockingIOError:
        early = b""
    assert early == b"", f"the server got part of a line: {early[:60]!r}"
    server.setblocking(True)
    rank.sendall(put[300:])
    assert _read_line(server) == put


def test_the_rank_is_told_the_smaller_value_length():
    server, rank = _relayed()
    rank.sendall(b"cmd=get_maxes\n")
    assert _read_line(server) == b"cmd=get_maxes\n"
    server.sendall(MAXES)
    assert b"vallen_max=512" in _read_line(rank)


RANK_PROGRAM = """
import os, socket, sys
pmi = socket.socket(fileno=int(os.environ["PMI_FD"]))
pmi.sendall(b"cmd=get_maxes\\n")
reply = b""
while not reply.endswith(b"\\n"):
    reply += pmi.recv(4096)
print(reply.decode().strip(), flush=True)
sys.exit(int(sys.argv[1]))
"""


def _start(args: list[str], env: dict[str, str], pass_fds=()) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "neoxlab.launch.pmi_relay", *args], env=env,
                            pass_fds=pass_fds, stdout=subprocess.PIPE, text=True)


def test_a_rank_behind_the_relay_talks_to_the_server_and_its_exit_code_passes_through():
    server, server_side = socket.socketpair()
    env = os.environ | {"PMI_FD": str(server_side.fileno())}
    relay = _start([sys.executable, "-c", RANK_PROGRAM, "3"], env, (server_side.fileno(),))
    server_side.close()
    server.settimeout(60)
    assert _read_line(server) == b"cmd=get_maxes\n"
    server.sendall(MAXES)
    out, _ = relay.communicate(timeout=60)
    assert "vallen_max=512" in out and relay.returncode == 3, (out, relay.returncode)


def test_a_signal_reaches_the_rank_and_the_relay_ends_by_it():
    server, server_side = socket.socketpair()
    env = os.environ | {"PMI_FD": str(server_side.fileno())}
    relay = _start([sys.executable, "-c",
                    "import sys, time; print('up', flush=True); time.sleep(300)"],
                   env, (server_side.fileno(),))
    server_side.close()
    assert relay.stdout.readline() == "up\n"
    relay.send_signal(signal.SIGTERM)
    assert relay.wait(timeout=60) == -signal.SIGTERM


def test_without_pmi_fd_the_command_runs_as_it_is():
    env = {k: v for k, v in os.environ.items() if k != "PMI_FD"}
    relay = _start([sys.executable, "-c", "import os; print(os.getpid())"], env)
    out, _ = relay.communicate(timeout=60)
    assert int(out) == relay.pid and relay.returncode == 0  # exec'd: no relay process


def test_pmi2_messages_which_end_without_a_newline_pass_at_once():
    server, rank = _relayed()
    fullinit = b"    43cmd=fullinit;pmijobid=1.0;pmirank=0;threaded=FALSE;"
    rank.sendall(fullinit)
    assert server.recv(4096) == fullinit
    reply = b"    32cmd=fullinit-response;rc=0;"
    server.sendall(reply)
    assert rank.recv(4096) == reply
