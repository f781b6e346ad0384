"""Rank start-up from one pre-imported process: import torch, DeepSpeed and megatron-core
once, then fork one process per rank on request.

Why: each rank spends ~8 CPU-s importing that stack before it does anything; eight ranks on
a 2-core machine wait ~30 s for their first step. Under mpiexec each rank is a small stub
(run.forked_rank) that hands this server its stdio, its PMI descriptor, its environment and
working directory; the forked process then runs `python -m <module> <args>` as that rank
would have. The server tells the stub the rank's pid (the stub forwards signals to it) and,
once it ends, its exit code or signal (the stub ends the same way, so mpiexec sees the
rank's own outcome). A rank whose stub dies (mpiexec killing the job) kills itself.

A server learns its task in two parts: the modules on its command line (the stack every
rank program shares: torch, megatron-core) it imports at once; then it waits for one JSON
line on stdin with the task's environment, warm-up modules and log, and imports those. So
`python -m neoxlab` can start a spare server first (prestart), whose stack imports run on
another core while the launcher itself imports, composes and checks, and hand it the task
once the run is planned: a launch then waits ~3 s less for its ranks. After a launch the
server stays the spare (release), and the next launch of the same task reuses it.

Only stdlib imports here: the stub side (connect) runs in every rank's fresh interpreter.
"""

from __future__ import annotations

import atexit
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
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

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


class Server:
    """A fork server seen from its launcher: its address, process and log."""

    def __init__(self, stack: Sequence[str], env: dict[str, str], log: Path,
                 temporary_log: bool = False):
        """Start a server (its own process group) that listens at once, imports `stack`,
        then waits for its task (configure); it ends when its stdin closes. A temporary
        log (a spare's, until its task names the run's) is removed with the server."""
        self.address, self.log = new_address(), log
        self._temporary_log = log if temporary_log else None
        self.prepared: tuple[tuple[str, ...], dict[str, str]] | None = None  # once configured
        with log.open("a") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "neoxlab.forkserver.server", self.address, *stack,
                 CMDLINE_ROOM],
                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=out,
                start_new_session=True,
            )
        self._answered, self._listening = threading.Event(), False
        threading.Thread(target=self._await_ready, daemon=True).start()

    def _await_ready(self) -> None:
        self._listening = self.proc.stdout.readline() == READY  # b"": it ended first
        self._answered.set()

    def configure(self, warm: Sequence[str], env: dict[str, str], log: Path,
                  timeout_s: float = 60.0) -> None:
        """Hand the server its task once it accepts connections (requests queue until it
        has imported `warm` with `env`); its output moves to `log`."""
        if not self._answered.wait(timeout_s) or not self._listening:
            self._fail(f"did not start listening (waited up to {timeout_s:.0f} s)")
        self._tell({"warm": list(warm), "env": env, "log": str(log)}, "its task")
        self.prepared, self.log = (tuple(warm), dict(env)), log

    def reuse(self, log: Path) -> None:
        """A later launch of the same task: the server's own output goes to its log."""
        self._tell({"log": str(log)}, "its next launch")
        self.log = log

    def _tell(self, line: dict, what: str) -> None:
        try:
            self.proc.stdin.write(json.dumps(line).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self._fail(f"ended before it got {what}")

    def _fail(self, what: str) -> NoReturn:
        """Stop the server and raise with the end of what it logged (maybe a spare's log)."""
        told = f"(no log at {self.log})"
        with contextlib.suppress(OSError):
            told = self.log.read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(f"the rank fork server {what}:\n{told}")

    def release(self) -> None:
        """After a launch: end the ranks it forked that are still alive, and keep the server
        as this process's spare, which the next launch of the same task takes (the members
        of a comparison start their ranks without waiting for another server's imports)."""
        global _spare
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        with contextlib.suppress(OSError):
            for pid in children.read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        if _spare is not None:
            _spare.stop()
        _spare = self

    def stop(self) -> None:
        """End the server and every rank it forked that is still alive (its process group)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        for path in (self.address, self._temporary_log):
            if path is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)


_spare: Server | None = None


def prestart(stack: Sequence[str]) -> None:
    """Start this process's spare server now, importing `stack`; the next start() takes it.
    Stopped at exit if no launch took it (a submission, a refused config)."""
    global _spare
    log = Path(tempfile.gettempdir()) / f"neoxlab-spare-{uuid.uuid4().hex[:16]}.log"
    _spare = Server(stack, dict(os.environ), log, temporary_log=True)


@atexit.register
def _stop_spare() -> None:
    """A spare nothing took, or the last launch's server, ends with this process."""
    if _spare is not None:
        _spare.stop()


def start(warm: Sequence[str], env: dict[str, str], log: Path) -> Server:
    """A server for one launch that has imported `warm` with `env` and logs to `log`: the
    spare when it is still free (prestart) or served the same task before (release), else
    a new one."""
    global _spare
    server, _spare = _spare, None
    if server is not None and server.prepared is not None:
        if server.prepared == (tuple(warm), env) and server.proc.poll() is None:
            server.reuse(log)
            return server
        server.stop()
        server = None
    if server is None:
        server = Server((), env, log)
    server.configure(warm, env, log)
    return server


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


def _serve(listener: socket.socket, launcher: _Launcher
           ) -> tuple[socket.socket, dict, list[int]]:
    """Fork a rank per request and report its pid and end to its stub. Returns only in a
    forked child (which becomes that rank); the server ends when its stdin closes."""
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin, selectors.EVENT_READ, "stdin")
    while True:
        while (line := launcher.next()) is not None:  # a later launch's log (Server.reuse)
            _log_to(line["log"])
        for key, _ in selector.select():
            if key.data == "stdin":
                if not launcher.read():
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


class _Launcher:
    """The launcher's JSON lines on stdin (a task, then log switches); one read may bring
    several, or part of one."""

    def __init__(self) -> None:
        self.rest = b""

    def read(self) -> bool:
        """Take in what stdin has; False at its end (the launcher has gone)."""
        chunk = os.read(0, 1 << 16)
        self.rest += chunk
        return bool(chunk)

    def next(self) -> dict | None:
        """The next whole line, or None until one has arrived."""
        if b"\n" not in self.rest:
            return None
        line, _, self.rest = self.rest.partition(b"\n")
        return json.loads(line)

    def task(self) -> dict | None:
        """Wait for the task (Server.configure); None if stdin ends first."""
        while (task := self.next()) is None:
            if not self.read():
                return None
        return task


def _take_task(task: dict) -> None:
    """The task's environment (its PYTHONPATH entries onto sys.path, where an interpreter
    started with it has them) and its log, which first gets what was logged so far."""
    os.environ.clear()
    os.environ.update(task["env"])
    entries = [p for p in task["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    for entry in reversed(entries):
        if entry not in sys.path:
            sys.path.insert(1, entry)
    _log_to(task["log"], carry_over=True)


def _log_to(log: str, carry_over: bool = False) -> None:
    """Send this server's output to `log` (with what was logged so far: a spare's)."""
    current = os.readlink("/proc/self/fd/2")
    if log == current:
        return
    try:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:  # e.g. a full disk: the ranks report that themselves
        print(f"[neoxlab] fork server: cannot log to {log} ({exc})", file=sys.stderr)
        return
    if carry_over:
        with contextlib.suppress(OSError), open(current, "rb") as earlier:
            os.write(fd, earlier.read())
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _import_all(modules: list[str]) -> None:
    for module in modules:  # a failing import fails again, with its traceback, in the rank
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001
            traceback.print_exc()


def main(argv: list[str]) -> None:
    address, stack = argv[0], [a for a in argv[1:] if a != CMDLINE_ROOM]
    gc.disable()  # Python's fork advice: no collections leave holes in the pages ranks share
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    os.chmod(address, 0o600)  # only this user's ranks may ask for a fork
    listener.listen(1024)
    sys.stdout.buffer.write(READY)
    sys.stdout.flush()
    os.dup2(2, 1)  # nobody reads the pipe after READY: later output goes to the log
    _import_all(stack)
    launcher = _Launcher()
    task = launcher.task()
    if task is None:  # the launcher has gone, or launched nothing, before it configured us
        os.unlink(address)
        sys.exit(0)
    _take_task(task)
    _import_all(task["warm"])
    if "mpi4py.MPI" in sys.modules:  # MPI_Init ran here: forked ranks would inherit it
        sys.exit(f"[neoxlab] fork server: warm imports {stack + task['warm']} initialized "
                 "MPI; import mpi4py.MPI only inside the rank")
    gc.freeze()  # the imported stack: ranks' collections leave it (and its pages) alone
    _become_rank(*_serve(listener, launcher))


if __name__ == "__main__":
    main(sys.argv[1:])
