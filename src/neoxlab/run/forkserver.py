"""Rank start-up from one pre-imported process: import torch, DeepSpeed and megatron-core
once, then fork one process per rank on request.

Why: each rank spends ~8 CPU-s importing that stack before it does anything; eight ranks on
a 2-core machine wait ~30 s for their first step. Under mpiexec each rank is a small stub
(run.forked_rank) that hands this server its stdio, its PMI descriptor, its environment and
working directory; the forked process then runs `python -m <module> <args>` as that rank
would have. The server tells the stub the rank's pid (the stub forwards signals to it) and,
once it ends, its exit code or signal (the stub ends the same way, so mpiexec sees the
rank's own outcome). A rank whose stub dies (mpiexec killing the job) kills itself.

Only stdlib imports here: the stub side (connect) runs in every rank's fresh interpreter.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import traceback
import uuid
from pathlib import Path

READY = b"listening\n"
HEADER = struct.Struct("!I")  # request length, then the JSON request
MAX_FDS = 8
# The server's last argument: room in its command line that a forked rank overwrites with its
# own, so ps, pkill -f and psutil see `python -m <module> <run_dir>` for every rank.
CMDLINE_ROOM = " " * 2048


def new_address() -> str:
    """A socket file in the temp dir: reachable from ranks in other network namespaces (an
    emulated cluster's), unlike an abstract socket, and short enough for the 108-byte limit."""
    return os.path.join(tempfile.gettempdir(), f"neoxlab-forkserver-{uuid.uuid4().hex[:16]}")


def start(address: str, warm: list[str], env: dict[str, str], log: Path,
          timeout_s: float = 60.0) -> subprocess.Popen:
    """Start a server (its own process group) and return once it accepts connections; it
    imports `warm` after that (requests queue meanwhile) and ends when its stdin closes."""
    with log.open("a") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "neoxlab.run.forkserver", address, *warm, CMDLINE_ROOM],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=out,
            start_new_session=True,
        )
    ready = threading.Event()
    threading.Thread(target=lambda: ready.set() if proc.stdout.readline() == READY else None,
                     daemon=True).start()
    if not ready.wait(timeout_s):
        proc.kill()
        raise RuntimeError(f"the rank fork server did not start within {timeout_s:.0f} s; "
                           f"see {log}")
    return proc


def stop(proc: subprocess.Popen, address: str) -> None:
    """End the server and every rank it forked that is still alive (its process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(address)


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    """The stub's request, its descriptors, and its pid (`stub_pid`) from the kernel."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, MAX_FDS)
    while len(data) < HEADER.size:
        data += conn.recv(1 << 16)
    (length,) = HEADER.unpack_from(data)
    body = data[HEADER.size:]
    while len(body) < length:
        chunk = conn.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the rank stub closed its connection mid-request")
        body += chunk
    request = json.loads(body)
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    request["stub_pid"] = struct.unpack("3i", creds)[0]
    return request, fds


def _join_namespaces(pid: int) -> None:
    """Enter the stub's mount and network namespaces where they differ from ours: a rank of
    an emulated cluster talks over its namespace's links and sees its /etc/hosts. Only a
    single-threaded process may change its mount namespace: call before any thread starts."""
    libc = ctypes.CDLL(None, use_errno=True)
    for kind in ("mnt", "net"):
        theirs, ours = f"/proc/{pid}/ns/{kind}", f"/proc/self/ns/{kind}"
        if os.stat(theirs).st_ino == os.stat(ours).st_ino:
            continue
        fd = os.open(theirs, os.O_RDONLY)
        try:
            if libc.setns(fd, 0) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns({theirs}): {os.strerror(err)}")
        finally:
            os.close(fd)


def _serve(listener: socket.socket) -> tuple[socket.socket, dict, list[int]]:
    """Fork a rank per request and report its pid and end to its stub. Returns only in a
    forked child (which becomes that rank); the server ends when its stdin closes."""
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin, selectors.EVENT_READ, "stdin")
    while True:
        for key, _ in selector.select():
            if key.data == "stdin":
                if not os.read(sys.stdin.fileno(), 4096):
                    # the launcher has gone, even SIGKILLed: leave no socket file behind
                    os.unlink(listener.getsockname())
                    sys.exit(0)
            elif key.data == "accept":
                conn, _ = listener.accept()
                try:
                    request, fds = _receive(conn)
                except (OSError, ValueError) as exc:
                    print(f"[neoxlab] fork server: bad request ({exc})", file=sys.stderr)
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    for other in list(selector.get_map().values()):
                        if other.data not in ("accept", "stdin"):
                            os.close(other.fd)
                            other.data[1].close()
                    selector.close()
                    listener.close()
                    return conn, request, fds
                for fd in fds:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                selector.register(pidfd, selectors.EVENT_READ, (pid, conn))
                _send(conn, f"pid {pid}\n")
            else:  # a rank ended: its stub ends the same way
                pid, conn = key.data
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                _send(conn, f"exit {os.waitstatus_to_exitcode(status)}\n")
                conn.close()


def _send(conn: socket.socket, line: str) -> None:
    try:
        conn.sendall(line.encode())
    except OSError:  # the stub is gone (killed with its job); its rank kills itself
        pass


def _die_with_stub(conn: socket.socket) -> None:
    """The stub sends nothing after its request: end of stream means it was killed."""
    while True:
        try:
            if not conn.recv(64):
                break
        except OSError:
            break
    os.kill(os.getpid(), signal.SIGKILL)


def _show_command_line(args: list[str]) -> None:
    """Write `args` over this process's original argv (the server's, with CMDLINE_ROOM), the
    memory /proc/<pid>/cmdline reads; a command longer than the room is cut short."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    arg_start, arg_end = int(fields[45]), int(fields[46])  # fields 48 and 49 of proc(5)
    room = arg_end - arg_start
    data = b"\0".join(os.fsencode(a) for a in args)[:room - 1]
    ctypes.memmove(arg_start, data.ljust(room, b"\0"), room)


def _become_rank(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """Take over the stub's stdio, PMI descriptor, environment and directory, then run the
    rank's module as `python -m` would; SystemExit carries its code out of the process."""
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
        os.close(fd)
    env = dict(request["env"])
    if len(fds) > 3:  # hydra's PMI connection, under a new descriptor number
        os.set_inheritable(fds[3], True)
        env["PMI_FD"] = str(fds[3])
    _join_namespaces(request["stub_pid"])
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request["cwd"])
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    gc.enable()
    threading.Thread(target=_die_with_stub, args=(conn,), daemon=True).start()
    sys.argv = [request["module"], *request["args"]]
    _show_command_line([sys.executable, "-m", request["module"], *request["args"]])
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


def main(argv: list[str]) -> None:
    address, warm = argv[0], [a for a in argv[1:] if a != CMDLINE_ROOM]
    gc.disable()  # Python's fork advice: no collections leave holes in the pages ranks share
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    os.chmod(address, 0o600)  # only this user's ranks may ask for a fork
    listener.listen(1024)
    sys.stdout.buffer.write(READY)
    sys.stdout.flush()
    os.dup2(2, 1)  # nobody reads the pipe after READY: later output goes to the log
    for module in warm:  # a failing import fails again, with its traceback, in the rank
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
    if "mpi4py.MPI" in sys.modules:  # MPI_Init ran here: forked ranks would inherit it
        sys.exit(f"[neoxlab] fork server: warm imports {warm} initialized MPI; "
                 "import mpi4py.MPI only inside the rank")
    gc.freeze()  # the imported stack: ranks' collections leave it (and its pages) alone
    _become_rank(*_serve(listener))


if __name__ == "__main__":
    main(sys.argv[1:])
