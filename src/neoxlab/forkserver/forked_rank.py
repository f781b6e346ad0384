"""`python -m neoxlab.forkserver.forked_rank <address> <module> <args...>`: what mpiexec starts per
rank when ranks come from the fork server (run.forkserver). It asks the server to run
`python -m <module> <args...>` as this rank, forwards the signals it receives to that rank,
and ends as the rank ended (exit code, or the same signal).

Only stdlib imports: this interpreter starts once per rank and must stay light.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

from neoxlab.forkserver.server import HEADER

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)


def _request(sock: socket.socket, module: str, args: list[str]) -> None:
    body = json.dumps({"module": module, "args": args, "env": dict(os.environ),
                       "cwd": os.getcwd()}).encode()
    fds = [0, 1, 2]
    if os.environ.get("PMI_FD", "").isdigit():
        fds.append(int(os.environ["PMI_FD"]))
    socket.send_fds(sock, [HEADER.pack(len(body)) + body], fds)


def _end_like(code: int) -> None:
    if code < 0:  # killed by a signal: mpiexec must see the same
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those cannot be caught anyway
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code
    sys.exit(code)


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit("usage: python -m neoxlab.forkserver.forked_rank <address> <module> [args...]")
    address, module, args = argv[0], argv[1], argv[2:]
    rank_pid: list[int] = []
    pending: list[int] = []

    def forward(signum: int, _frame) -> None:
        if rank_pid:
            os.kill(rank_pid[0], signum)
        else:
            pending.append(signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address)
        _request(sock, module, args)
    except OSError as exc:
        sys.exit(f"[neoxlab] rank stub: the fork server at {address!r} is not reachable "
                 f"({exc}); set launch.rank_start=exec to start ranks without it")
    reader = sock.makefile("r")
    for line in reader:
        word, value = line.split()
        if word == "pid":
            rank_pid.append(int(value))
            for signum in pending:
                os.kill(rank_pid[0], signum)
        elif word == "exit":
            _end_like(int(value))
    sys.exit("[neoxlab] rank stub: the fork server ended before this rank did")


if __name__ == "__main__":
    main(sys.argv[1:])
