"""huey with SQLite storage (``SqliteHuey``): ``task.schedule`` / calls, and its consumer.

Measured twice: with huey's default (``fsync=False``: its commits never wait for the
disk) and with ``fsync=True``, the durability of flask_defer's SQLite default.

The consumer runs in this process with one worker thread and huey's defaults; the
drain ends when the handler has run for every job (huey has no "stop when empty"
mode). huey has no bulk enqueue API.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from ..env import Database
from ..results import NotAvailable, Sample


class HueyPeer:
    label = "huey (SqliteHuey)"
    #: huey's default never syncs a commit to disk; ``fsync=True`` does, as flask_defer's
    #: SQLite default (synchronous=FULL) does: the equal-durability comparison.
    fsync = False

    def __init__(self, db: Database) -> None:
        from huey import SqliteHuey

        assert db.path is not None
        self.huey: Any = SqliteHuey(
            "bench", filename=str(db.path.with_suffix(".huey.db")), fsync=self.fsync
        )
        self.ran = 0
        self.target = 0
        self.finished = threading.Event()
        self.finished_at = 0.0
        logging.getLogger("huey").setLevel(logging.WARNING)

        @self.huey.task()
        def noop(n: int) -> None:
            self.ran += 1
            if self.ran >= self.target:
                self.finished_at = time.perf_counter()
                self.finished.set()

        self.task = noop

    def enqueue_each(self, count: int, delay_seconds: float) -> int:
        for n in range(count):
            self.task.schedule(args=(n,), delay=delay_seconds)
        return count

    def enqueue_bulk(self, count: int, delay_seconds: float) -> int:
        raise NotAvailable("huey has no bulk enqueue API")

    def fill_due(self, count: int) -> None:
        for n in range(count):
            self.task(n)

    def drain(self, expected: int) -> Sample:
        """From starting the consumer to the last handler's end (huey deletes a task from
        its queue when it dequeues it, so there is no acknowledgement after the run)."""
        self.ran = 0
        self.target = expected
        self.finished.clear()
        saved = {
            sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        }
        consumer = self.huey.create_consumer(
            workers=1, worker_type="thread", periodic=False, check_worker_health=False
        )
        start = time.perf_counter()
        try:
            consumer.start()
            deadline = time.monotonic() + 600
            while not self.finished.wait(0.05):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"huey ran {self.ran} of {expected} jobs in 600 s")
            end = self.finished_at
        finally:
            consumer.stop(graceful=True)
            for sig, handler in saved.items():
                signal.signal(sig, handler)
        return Sample(self.ran, end - start)

    def clear(self) -> None:
        self.huey.flush()

    def close(self) -> None:
        self.huey.storage.close()


class HueyFsyncPeer(HueyPeer):
    """huey with ``fsync=True``: every enqueue and dequeue waits for the disk."""

    label = "huey (SqliteHuey, fsync=True)"
    fsync = True
