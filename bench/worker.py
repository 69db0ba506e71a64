"""The plug-in point for ``flask defer worker`` (built in a parallel branch).

Until the worker command exists, the drain measurements use ``defer.run_due()`` and the
lateness measurement reports "not measured: worker not available". Once the ``defer``
CLI group has a ``worker`` command, this module starts it as a subprocess exactly as an
operator would::

    python -m flask --app bench.app:create_app defer worker [--burst] [--concurrency N]

Options are passed only if the command declares them (``--burst``: exit when nothing is
due; ``--concurrency``), so the bench follows whatever the worker ends up offering.
Without ``--burst`` the bench waits until every job is settled and sends SIGTERM (the
worker's graceful shutdown).
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .env import ROOT, Database

APP_IMPORT = "bench.app:create_app"


def worker_options() -> set[str] | None:
    """The option names of ``flask defer worker``, or None when there is no such command."""
    from flask_defer.cli import defer_cli

    command = defer_cli.commands.get("worker")
    if command is None:
        return None
    names: set[str] = set()
    for param in command.params:
        names.update(opt.lstrip("-") for opt in getattr(param, "opts", []))
    return names


def worker_available() -> bool:
    return worker_options() is not None


def worker_argv(*, concurrency: int | None, burst: bool) -> list[str]:
    """The command line of one worker process."""
    options = worker_options()
    if options is None:
        raise RuntimeError("flask defer worker does not exist yet")
    argv = [sys.executable, "-m", "flask", "--app", APP_IMPORT, "defer", "worker"]
    if burst and "burst" in options:
        argv.append("--burst")
    if concurrency is not None and "concurrency" in options:
        argv += ["--concurrency", str(concurrency)]
    return argv


def describe(concurrency: int) -> str:
    """How a drain with *concurrency* is run, for the table."""
    options = worker_options()
    if options is not None and "concurrency" in options:
        return f"flask_defer worker --concurrency {concurrency}"
    return f"flask_defer worker, {concurrency} process{'es' if concurrency > 1 else ''}"


def processes_for(concurrency: int) -> int:
    """How many worker processes give *concurrency*: 1 if it has --concurrency, else N."""
    options = worker_options() or set()
    return 1 if "concurrency" in options else concurrency


class WorkerProcesses:
    """Worker subprocesses on one database, their output in a log file."""

    def __init__(
        self,
        database: Database,
        log_dir: Path,
        *,
        concurrency: int | None,
        burst: bool,
        processes: int | None = None,
        history: bool = True,
    ):
        """*processes* worker processes (default: as many as *concurrency* needs), each
        with ``--concurrency`` when given, else the worker's own default; ``history``
        False runs them with ``DEFER_HISTORY = False``."""
        self.database = database
        self.burst = burst and "burst" in (worker_options() or set())
        env = dict(os.environ, BENCH_DATABASE_URL=database.url, PYTHONPATH=str(ROOT))
        env["BENCH_APP_DEFER_HISTORY"] = "true" if history else "false"  # JSON values
        argv = worker_argv(concurrency=concurrency, burst=burst)
        self.log_path = log_dir / f"worker-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("wb")
        self.procs = [
            subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)
            for _ in range(processes or processes_for(concurrency or 1))
        ]
        #: Each worker process's own resource usage, by pid, once it has exited by itself
        #: (``--burst``). Its own, not ``RUSAGE_CHILDREN``'s: that also counts any earlier
        #: child the subprocess module happens to reap meanwhile (a finished server of
        #: another section, reaped when the next Popen starts), which once made a
        #: worker's CPU per job read 19 µs instead of about 230.
        self.usage: dict[int, resource.struct_rusage] = {}

    def wait(self, settled: Callable[[], bool], timeout: float) -> None:
        """Until the workers exit (burst) or *settled* says all is done, then stop them.

        Workers that all exited end the wait either way (without ``--burst`` they
        failed, which is reported at once). *settled* is asked every 0.2 s: each
        look is a connection of its own, and a drain runs meanwhile."""
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if all(self._exited(p) for p in self.procs):
                    break
                if not self.burst and settled():
                    break
                time.sleep(0.05 if self.burst else 0.2)
            else:
                raise TimeoutError(f"worker did not finish in {timeout:.0f}s; see {self.log_path}")
        finally:
            self.stop()
        failed = [p.returncode for p in self.procs if p.returncode not in (0, -signal.SIGTERM)]
        if failed:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
            why = [line for line in lines if "Error" in line or "ERROR" in line][-1:] or lines[-1:]
            raise RuntimeError(f"worker exited with {failed}: {' '.join(why)} ({self.log_path})")

    def _exited(self, proc: subprocess.Popen[bytes]) -> bool:
        """Whether *proc* has exited, reaped here with its resource usage kept."""
        if proc.returncode is not None:
            return True
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == 0:
            return False
        proc.returncode = os.waitstatus_to_exitcode(status)
        self.usage[pid] = usage
        return True

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._log.close()
