"""procrastinate (PostgreSQL): ``Task.defer`` / ``batch_defer`` and ``App.run_worker``.

The task is ``async def`` (procrastinate's fast path; sync tasks go through a thread).
The worker runs with its defaults (concurrency 1, LISTEN/NOTIFY on) and ``wait=False``,
which returns once the queue is empty: the documented way to drain.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..env import Database
from ..results import Sample


class ProcrastinatePeer:
    label = "procrastinate"

    def __init__(self, db: Database) -> None:
        import procrastinate

        assert db.dsn is not None
        self.dsn = db.dsn
        self.app: Any = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=db.dsn))
        self.ran = 0

        @self.app.task(name="noop")
        async def noop(n: int) -> None:
            self.ran += 1

        self.task = noop
        # The worker logs every job at INFO; the bench keeps procrastinate's defaults
        # but does not print them.
        logging.getLogger("procrastinate").setLevel(logging.WARNING)
        self.app.open()
        self.app.schema_manager.apply_schema()

    def enqueue_each(self, count: int, delay_seconds: float) -> int:
        deferrer = self.task.configure(schedule_in={"seconds": delay_seconds})
        for n in range(count):
            deferrer.defer(n=n)
        return count

    def enqueue_bulk(self, count: int, delay_seconds: float) -> int:
        deferrer = self.task.configure(schedule_in={"seconds": delay_seconds})
        return len(deferrer.batch_defer(*({"n": n} for n in range(count))))

    def fill_due(self, count: int) -> None:
        step = 5000
        for start in range(0, count, step):
            self.task.batch_defer(*({"n": n} for n in range(start, min(count, start + step))))
        self._execute("ANALYZE")

    def drain(self, expected: int) -> Sample:
        """From the call to the last ``succeeded`` event procrastinate recorded."""
        self.ran = 0
        start = time.time()
        self.app.run_worker(wait=False, install_signal_handlers=False)
        # run_worker closes the app's connector on the way out; reopen for the next round.
        self.app.open()
        import psycopg

        with psycopg.connect(self.dsn) as conn:
            row = conn.execute(
                "SELECT extract(epoch FROM max(at)), count(*) FROM procrastinate_events"
                " WHERE type = 'succeeded'"
            ).fetchone()
        assert row is not None
        last, succeeded = float(row[0] or 0), int(row[1])
        if succeeded != expected:
            raise RuntimeError(f"procrastinate recorded {succeeded} successes of {expected}")
        return Sample(self.ran, last - start)

    def clear(self) -> None:
        self._execute("TRUNCATE procrastinate_jobs CASCADE")

    def _execute(self, statement: str) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(statement)  # type: ignore[arg-type]

    def close(self) -> None:
        self.app.close()
