"""Start one rank behind a relay of its PMI-1 socket, so that Slurm's pmi2 plugin can read
every line MPICH sends it:  python -m neoxlab.launch.pmi_relay <command...>

Slurm 22.05's pmi2 plugin reads a PMI-1 request with one read() of at most 1024 bytes, yet
tells the client that a value may be 1024 bytes long (`cmd=maxes ... vallen_max=1024`).
MPICH pads its business card to 4 KB and puts it in segments as long as that allows; a
segment whose hex does not compress (the padding is uninitialised memory) makes a line of
about 1080 bytes, which the plugin splits into two broken requests ("mpi/pmi2: invalid client
request"), and the ranks wait in MPI_Init for ever. How often depends on that memory: 0 of
28 starts on one machine, 2 of 4 in one CI run.

The relay tells the rank a smaller vallen_max, so every line fits, and forwards PMI-1 by
whole lines only. It stays out of the way otherwise: PMI-2's messages pass as they come;
without PMI_FD (hydra, PMI_PORT) it just runs the command; the rank's exit status and
signals pass through.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading

# what MPICH is told a value may hold: half the plugin's 1024-byte line, so that a segment
# whose encoding outgrows it (MPICH's run-length hex: told 1024, it put 1045 characters) and
# the `cmd=put kvsname=<job.step> key=<key> value=` around it still fit in one read
VALLEN_MAX = 512
PMI1_STARTS = (b"cmd=", b"mcmd=")
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
                     signal.SIGUSR2)


def command(program: list[str], python: str = sys.executable) -> list[str]:
    """The program started behind the relay."""
    return [python, "-m", __name__, *program]


def smaller_values(line: bytes) -> bytes:
    """The server's `cmd=maxes` reply with vallen_max lowered to VALLEN_MAX; other lines as
    they are."""
    if not line.startswith(b"cmd=maxes"):
        return line
    return re.sub(rb"vallen_max=(\d+)",
                  lambda m: b"vallen_max=%d" % min(int(m[1]), VALLEN_MAX), line)


def ready(buffer: bytes) -> tuple[bytes, bytes]:
    """(what can be forwarded now, what waits). PMI-1 (`cmd=...` or `mcmd=...` lines) goes
    by whole lines; anything else, such as PMI-2's length-prefixed messages, at once."""
    if not any(buffer.startswith(start) or start.startswith(buffer) for start in PMI1_STARTS):
        return buffer, b""
    complete, newline, rest = buffer.rpartition(b"\n")
    return complete + newline, rest


def relay(server: socket.socket, client: socket.socket) -> None:
    """Forward both ways until either side closes; the server's maxes rewritten."""
    pending = {server: b"", client: b""}
    peer = {server: client, client: server}
    with selectors.DefaultSelector() as selector:
        for sock in pending:
            selector.register(sock, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                sock = key.fileobj
                data = sock.recv(65536)
                if not data:
                    return
                out, pending[sock] = ready(pending[sock] + data)
                if not out:
                    continue
                if sock is server:
                    out = b"".join(smaller_values(line)
                                   for line in out.splitlines(keepends=True))
                peer[sock].sendall(out)


def run(program: list[str]) -> int:
    """The program as a child whose PMI_FD is the relay's end (Popen closes the server's
    descriptor in it); its exit status."""
    server = socket.socket(fileno=int(os.environ["PMI_FD"]))
    ours, theirs = socket.socketpair()
    env = os.environ | {"PMI_FD": str(theirs.fileno())}
    child = subprocess.Popen(program, env=env, pass_fds=(theirs.fileno(),))
    theirs.close()
    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, lambda signum, _frame: child.send_signal(signum))
    threading.Thread(target=relay, args=(server, ours), daemon=True).start()
    return child.wait()


def exit_like(code: int) -> None:
    """End this process as the child ended: a signal's death is reported as that signal."""
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python -m neoxlab.launch.pmi_relay <command...>")
    if "PMI_FD" not in os.environ:
        os.execvp(argv[0], argv)
    exit_like(run(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
