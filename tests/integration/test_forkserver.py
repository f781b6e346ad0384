"""Ranks forked from the fork server behave, for mpiexec, like ranks it started itself:
rank facts from PMI, argv/cwd/environment of the stub, exit codes and deaths by signal seen
by mpiexec, stop signals forwarded to the rank, and no rank left once its stub is killed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from neoxlab.forkserver import server as forkserver
from neoxlab.launch.local import mpiexec_path
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.timeout(120)

TOY = """
import json, os, signal, sys, threading
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
mode, out = sys.argv[1], sys.argv[2]
facts = {"rank": rank, "size": comm.Get_size(), "argv": sys.argv[1:], "cwd": os.getcwd(),
         "marker": os.environ.get("TOY_MARKER"), "parent": os.getppid()}
stopped = threading.Event()
signal.signal(signal.SIGUSR1, lambda *_: stopped.set())
with open(f"{out}/rank{rank}.json", "w") as f:
    json.dump(facts, f)
comm.Barrier()
if mode == "kill" and rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "wait_usr1":
    stopped.wait(60)
    open(f"{out}/rank{rank}.stopped", "w").close()
if mode == "hang":
    threading.Event().wait()
comm.Barrier()
if mode == "exit3" and rank == 1:
    sys.exit(3)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    toy_dir = tmp_path_factory.mktemp("toy")
    (toy_dir / "toy_rank.py").write_text(TOY)
    env = dict(os.environ, PYTHONPATH=f"{toy_dir}{os.pathsep}{REPO_ROOT / 'src'}")
    server = forkserver.start(["json"], env, toy_dir / "forkserver.log")
    yield server.address, env, server.proc
    server.stop()


def _job(server, out: Path, mode: str, ranks: int = 2) -> subprocess.Popen:
    address, env, _ = server
    out.mkdir(exist_ok=True)
    cmd = [mpiexec_path(), "-n", str(ranks), sys.executable, "-m", "neoxlab.forkserver.forked_rank",
           address, "toy_rank", mode, str(out)]
    return subprocess.Popen(cmd, env=dict(env, TOY_MARKER="from-the-stub"), cwd=out,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _facts(out: Path, ranks: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def _until(condition, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_ranks_are_the_servers_children_with_the_stubs_facts(server, tmp_path):
    job = _job(server, tmp_path, "ok", ranks=3)
    output, _ = job.communicate(timeout=60)
    assert job.returncode == 0, output
    facts = _facts(tmp_path, 3)
    assert sorted(f["rank"] for f in facts) == [0, 1, 2]
    assert {f["size"] for f in facts} == {3}
    assert all(f["argv"] == ["ok", str(tmp_path)] for f in facts)
    assert all(f["cwd"] == str(tmp_path) and f["marker"] == "from-the-stub" for f in facts)
    assert {f["parent"] for f in facts} == {server[2].pid}  # forked, not started by mpiexec


def test_exit_code_reaches_mpiexec(server, tmp_path):
    job = _job(server, tmp_path, "exit3")
    output, _ = job.communicate(timeout=60)
    assert job.returncode == 3, output


def test_death_by_signal_reaches_mpiexec(server, tmp_path):
    job = _job(server, tmp_path, "kill")
    output, _ = job.communicate(timeout=60)
    assert job.returncode != 0
    assert "KILLED BY SIGNAL: 9" in output or "signal 9" in output, output


def test_stop_signal_is_forwarded_to_every_rank(server, tmp_path):
    job = _job(server, tmp_path, "wait_usr1")
    _until(lambda: all((tmp_path / f"rank{r}.json").exists() for r in range(2)))
    job.send_signal(signal.SIGUSR1)  # mpiexec hands it to the stubs, they to the ranks
    output, _ = job.communicate(timeout=60)
    assert job.returncode == 0, output
    assert all((tmp_path / f"rank{r}.stopped").exists() for r in range(2))


def test_ranks_die_with_their_killed_job(server, tmp_path):
    job = _job(server, tmp_path, "hang")
    _until(lambda: all((tmp_path / f"rank{r}.json").exists() for r in range(2)))
    ranks = psutil.Process(server[2].pid).children()
    assert len(ranks) == 2
    os.killpg(job.pid, signal.SIGKILL)  # what the launcher does on timeout
    job.wait(timeout=30)
    gone, alive = psutil.wait_procs(ranks, timeout=30)
    assert not alive, f"ranks outlived their stubs: {[p.pid for p in alive]}"


def test_server_ends_and_removes_its_socket_when_its_launcher_goes(tmp_path):
    """A launcher killed with SIGKILL cannot stop its server: the server sees its stdin pipe
    close, removes its socket file and exits."""
    server = forkserver.start([], dict(os.environ), tmp_path / "forkserver.log")
    try:
        assert Path(server.address).exists()
        server.proc.stdin.close()  # what the launcher's death does to the pipe
        assert server.proc.wait(timeout=30) == 0
        assert not Path(server.address).exists()
    finally:
        server.stop()


STACK_MODULE = "import sys; print('stack imported', file=sys.stderr)\n"
WARM_MODULE = """
import os, sys
print("warm imported with TOY_TASK=" + os.environ.get("TOY_TASK", "unset"), file=sys.stderr)
"""


def test_a_spare_imports_its_stack_first_then_takes_the_tasks_env_path_and_log(
        tmp_path, monkeypatch):
    """prestart: the spare imports its stack with the launcher's environment; the launch's
    start() takes it, and the warm imports then see the task's environment, its PYTHONPATH
    entries are importable (the ranks' module lives there) and the run's log holds what the
    spare logged before it had a task; its temporary log goes with it."""
    stack_dir, toy_dir = tmp_path / "stack", tmp_path / "toy"
    stack_dir.mkdir()
    toy_dir.mkdir()
    (stack_dir / "toy_stack.py").write_text(STACK_MODULE)
    (toy_dir / "toy_warm.py").write_text(WARM_MODULE)
    (toy_dir / "toy_rank.py").write_text(TOY)
    src = str(REPO_ROOT / "src")
    monkeypatch.setenv("PYTHONPATH", f"{stack_dir}{os.pathsep}{src}")
    forkserver.prestart(["toy_stack"])
    spare = forkserver._spare
    temporary_log = spare.log
    env = dict(os.environ, PYTHONPATH=f"{toy_dir}{os.pathsep}{src}", TOY_TASK="yes")
    log = tmp_path / "forkserver.log"
    server = forkserver.start(["toy_warm"], env, log)
    try:
        assert server is spare and forkserver._spare is None  # taken, not started anew
        out = tmp_path / "job"
        job = _job((server.address, env, server.proc), out, "ok")
        output, _ = job.communicate(timeout=60)
        assert job.returncode == 0, output  # toy_rank was found on the task's PYTHONPATH
        assert {f["parent"] for f in _facts(out, 2)} == {server.proc.pid}
        text = log.read_text()
        assert "stack imported" in text, text
        assert "warm imported with TOY_TASK=yes" in text, text
        assert text.index("stack imported") < text.index("warm imported")
    finally:
        server.stop()
    assert temporary_log != log and not temporary_log.exists()
    assert not Path(server.address).exists()


def test_an_unused_spare_is_stopped_when_its_process_exits(tmp_path):
    """A launcher that launches nothing (a submission, a refused config) leaves no server."""
    code = ("from neoxlab.forkserver import server; server.prestart(['json']); "
            "print(server._spare.proc.pid, server._spare.address, flush=True)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT / "src")))
    assert done.returncode == 0, done.stderr
    pid, address = done.stdout.split()
    try:
        spare = psutil.Process(int(pid))
    except psutil.NoSuchProcess:
        spare = None
    if spare is not None:
        gone, alive = psutil.wait_procs([spare], timeout=30)
        assert not alive, "the spare outlived the process that started it"
    assert not Path(address).exists()


def test_a_server_that_dies_before_its_task_fails_the_launch_with_its_log(tmp_path):
    (tmp_path / "toy_dying.py").write_text(
        "import os, sys\nprint('dying on import', file=sys.stderr)\nos._exit(3)\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO_ROOT / 'src'}")
    server = forkserver.Server(["toy_dying"], env, tmp_path / "spare.log")
    assert server.proc.wait(timeout=60) == 3
    with pytest.raises(RuntimeError, match="ended before it got its task") as failed:
        server.configure([], env, tmp_path / "forkserver.log")
    assert "dying on import" in str(failed.value)
    assert not Path(server.address).exists()


def test_a_released_server_serves_the_next_launch_of_the_same_task_only(tmp_path):
    """release() keeps the server as the spare: the next start() of the same task (a
    comparison's next member) gets it back, its own messages go to the new launch's log,
    and a different task gets a new server while the old one is stopped."""
    toy_dir = tmp_path / "toy"
    toy_dir.mkdir()
    (toy_dir / "toy_rank.py").write_text(TOY)
    env = dict(os.environ, PYTHONPATH=f"{toy_dir}{os.pathsep}{REPO_ROOT / 'src'}")
    first = forkserver.start(["json"], env, tmp_path / "first.log")
    try:
        first.release()
        again = forkserver.start(["json"], env, tmp_path / "second.log")
        assert again is first and forkserver._spare is None
        job = _job((again.address, env, again.proc), tmp_path / "job", "ok")
        output, _ = job.communicate(timeout=60)
        assert job.returncode == 0, output
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bad:  # a garbled request
            bad.connect(again.address)
            bad.sendall(b"\0\0\0\5{not")
        _until(lambda: "bad request" in (tmp_path / "second.log").read_text())
        assert "bad request" not in (tmp_path / "first.log").read_text()
        again.release()
        other = forkserver.start(["json", "csv"], env, tmp_path / "third.log")
        assert other is not first
        assert first.proc.wait(timeout=30) is not None  # stopped, not left running
        other.stop()
    finally:
        first.stop()
