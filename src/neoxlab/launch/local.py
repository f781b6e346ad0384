"""Run every rank on this machine with mpiexec; the job ends as soon as any rank fails.

mpiexec (MPICH hydra, from the mpich wheel) kills the remaining ranks when one dies; we
additionally kill the whole process group on exit, timeout or Ctrl-C so nothing is left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from neoxlab.config import Config
from neoxlab.engines.registry import engine_of
from neoxlab.forkserver import server as forkserver
from neoxlab.launch import shm
from neoxlab.launch.attempt import clear_previous_attempt
from neoxlab.launch.failure import RankWatch, diagnose, fatal_startup
from neoxlab.launch.ranks import rank_command, rank_env
from neoxlab.layout import world_size
from neoxlab.run import rundir
from neoxlab.run.progress import LastFrames, child_env
from neoxlab.run.rankjob import PREEMPTED_EXIT, RankProgram

GRACE_S = 10
POLL_S = 0.2


def mpiexec_path() -> str:
    beside = Path(sys.executable).with_name("mpiexec")
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if not found:
        raise FileNotFoundError("mpiexec not found: install the 'mpich' wheel (make install)")
    return found


def rank_environment(cfg: Config, run_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    extra = rank_env(cfg, run_dir)
    if "PYTHONPATH" in extra and env.get("PYTHONPATH"):
        extra["PYTHONPATH"] += os.pathsep + env["PYTHONPATH"]
    env.update(extra)
    env.update(child_env())  # rank 0 writes to our pipe: we know whether it ends in a terminal
    return env


def rank_program(cfg: Config, run_dir: Path, program: RankProgram,
                 server: str | None) -> list[str]:
    """What mpiexec starts per rank: the rank's program, or (server) a stub that has the fork
    server run it."""
    command = rank_command(cfg, run_dir, sys.executable, program)
    if server is None:
        return command
    python, _, module, *args = command  # python -m <module> <args>
    return [python, "-m", "neoxlab.forkserver.forked_rank", server, module, *args]


def mpiexec_command(cfg: Config, run_dir: Path, program: RankProgram,
                    server: str | None) -> list[str]:
    return [mpiexec_path(), "-n", str(world_size(cfg)),
            *rank_program(cfg, run_dir, program, server)]


def uses_forkserver(cfg: Config) -> bool:
    """Engines whose ranks can share one pre-imported process (not GPT-NeoX, whose entry sets
    up its own interpreter)."""
    return cfg.launch.rank_start == "forkserver" and engine_of(cfg).forkable


@contextlib.contextmanager
def rank_server(cfg: Config, run_dir: Path, program: RankProgram,
                env: dict[str, str]) -> Iterator[str | None]:
    """A fork server's address while the job runs (None: ranks start as fresh processes)."""
    if not uses_forkserver(cfg):
        yield None
        return
    server = forkserver.start(program.warm_imports, env,
                              run_dir / "logs" / "forkserver.log")
    try:
        yield server.address
    finally:
        server.release()  # ends any rank still alive; the next launch here may reuse it


def _pump(stream, sinks, captured: list[str]) -> None:
    """Copy the launcher's output to the terminal and launcher.log as it arrives."""
    for chunk in iter(lambda: stream.read1(4096), b""):
        text = chunk.decode(errors="replace")
        captured.append(text)
        for sink in list(sinks):
            try:
                sink.write(text)
                sink.flush()
            except OSError:  # launcher.log on a full disk: the terminal still gets it all
                sinks.remove(sink)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait(proc: subprocess.Popen, watch: RankWatch, timeout_s: float, started: float,
          output: list[str]) -> tuple[int | None, str | None]:
    """(the job's exit code, None), or (None, why it must be stopped): at the deadline, or
    as soon as the launcher's output shows the ranks cannot start. Watches which rank dies
    first."""
    scanned = 0
    while time.time() < started + timeout_s:
        watch.poll()
        fatal = fatal_startup("".join(output[max(scanned - 1, 0):]))  # a line split in two
        scanned = len(output)
        if fatal is not None:
            return None, fatal
        try:
            return proc.wait(timeout=POLL_S), None
        except subprocess.TimeoutExpired:
            continue
    return None, f"timed out after launch.timeout_s={timeout_s} s"


@contextlib.contextmanager
def forward_stop_signals(proc: subprocess.Popen):
    """SIGUSR1/SIGTERM to the launcher go to mpiexec, which hands them to every rank: they
    checkpoint and stop (exit 85) instead of dying with the launcher."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda signum, _: proc.send_signal(signum))
                for sig in (signal.SIGUSR1, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def launch(cfg: Config, run_dir: Path, program: RankProgram,
           command: Callable[[str | None], list[str]] | None = None,
           env: dict[str, str] | None = None) -> int:
    """Run the job to its end; status.json ends completed, preempted (exit 85, checkpoint
    saved on SIGUSR1/SIGTERM) or failed (with rank and error). An emulated cluster
    (launch.emulated) passes its own command (given the fork server's address) and
    environment."""
    env = env or rank_environment(cfg, run_dir)
    with rank_server(cfg, run_dir, program, env) as server:
        if command is None:
            return _launch(cfg, run_dir, mpiexec_command(cfg, run_dir, program, server), env)
        return _launch(cfg, run_dir, command(server), env)


def _launch(cfg: Config, run_dir: Path, cmd: list[str], env: dict[str, str]) -> int:
    clear_previous_attempt(run_dir)
    captured: list[str] = []
    log = LastFrames((run_dir / "logs" / "launcher.log").open("a"))  # a bar's last frame
    log.write(" ".join(cmd) + "\n")
    segments_before = shm.segments()
    started = time.time()
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    pump = threading.Thread(target=_pump, args=(proc.stdout, [sys.stderr, log], captured))
    pump.start()
    reason = None
    watch = RankWatch(run_dir, world_size(cfg))
    try:
        with forward_stop_signals(proc):
            code, reason = _wait(proc, watch, cfg.launch.timeout_s, started, captured)
        if code is None:
            _kill_group(proc)
            code = proc.wait()
    except KeyboardInterrupt:
        reason = "interrupted (Ctrl-C)"
        os.killpg(proc.pid, signal.SIGINT)
        try:
            code = proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            code = proc.wait()
    finally:
        _kill_group(proc)  # hydra proxies or stray ranks must not outlive the job
        watch.reap()
        left = shm.remove_stale(segments_before)  # ranks that died without MPI_Finalize
        pump.join(timeout=5)
        with contextlib.suppress(OSError):  # a full disk fails the flush; reported below
            if left:
                log.write(f"[neoxlab] removed {len(left)} MPI shared-memory segment(s) the "
                          f"job's ranks left in {shm.SHM_DIR}: {', '.join(left)}\n")
            log.close()
    elapsed = round(time.time() - started, 3)
    state = rundir.read_json(run_dir / "status.json").get("state")
    if code == 0 and reason is None:
        if state != "completed":
            rundir.set_status(run_dir, rundir.State.COMPLETED, exit_code=0, elapsed_s=elapsed)
        else:
            rundir.set_status(run_dir, rundir.State.COMPLETED, elapsed_s=elapsed)
        rundir.end_attempt(run_dir, 0, "completed")
        return 0
    if code == PREEMPTED_EXIT and reason is None and state == "preempted":
        rundir.set_status(run_dir, rundir.State.PREEMPTED, elapsed_s=elapsed)
        return code
    fields = diagnose(run_dir, "".join(captured), code, watch.first_dead)
    if reason is not None:
        fields["error"] = f"{reason}; {fields['error']}"
    failed = f"rank {fields['failed_rank']}: {fields['error']}"
    try:
        rundir.set_status(run_dir, rundir.State.FAILED, exit_code=code or 1,
                          elapsed_s=elapsed, **fields)
    finally:  # a full disk raises after writing status.json in place: close the attempt too
        rundir.end_attempt(run_dir, code or 1, failed, overwrite=True)  # the launcher knows best
    return code or 1
