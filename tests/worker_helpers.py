"""Helpers of the worker tests: run a worker in a thread or a process, wait for facts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flask_defer.engine.worker import Worker

ROOT = Path(__file__).resolve().parent.parent


def wait_until(
    condition: Callable[[], Any], *, timeout: float = 20.0, interval: float = 0.05
) -> Any:
    """Poll *condition* until it returns something truthy; fail after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s: {condition}")
        time.sleep(interval)


@contextmanager
def worker_thread(worker: Worker) -> Iterator[Worker]:
    """Run *worker* in a thread for the block; stop it gracefully afterwards."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(install_signal_handlers=False)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    thread = threading.Thread(target=run, name="test-worker")
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(30)
        assert not thread.is_alive(), "the worker did not stop"
    if errors:
        raise errors[0]


def wait_for_handler_threads() -> None:
    """Wait until every handler thread has exited, abandoned ones included.

    A handler released at shutdown or abandoned after its timeout still returns and
    acknowledges (in vain); it must do so before the test disposes the engine, or it
    would open a connection nobody closes.
    """
    wait_until(
        lambda: not any(
            t.name.startswith("flask-defer-handler") for t in threading.enumerate()
        )
    )


def worker_app_env(database_url: str, **config: Any) -> dict[str, str]:
    """The environment of a ``flask --app tests.worker_app ...`` child process."""
    env = dict(os.environ)
    env["WORKER_APP_SQLALCHEMY_DATABASE_URI"] = database_url
    for name, value in config.items():
        env[f"WORKER_APP_{name}"] = _json(value)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


class WorkerProcess:
    """``flask --app tests.worker_app defer worker ...`` as a real child process."""

    def __init__(
        self, database_url: str, log_path: Path, *args: str, **config: Any
    ) -> None:
        env = worker_app_env(database_url, **config)
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flask",
                "--app",
                "tests.worker_app",
                "defer",
                "worker",
                "--log-level",
                "DEBUG",
                *args,
            ],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_started(self, timeout: float = 20.0) -> None:
        wait_until(lambda: " started: " in self.log() or self.process.poll() is not None,
                   timeout=timeout)
        assert self.process.poll() is None, f"worker exited early:\n{self.log()}"

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"worker did not exit within {timeout} s:\n{self.log()}"
            ) from None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def close(self) -> None:
        self.kill()
        self._log.close()


def _json(value: Any) -> str:
    import json

    return json.dumps(value)
