"""deferjob (PostgreSQL): ``Defer.schedule`` and the worker's ``run_once``.

deferjob opens a new psycopg connection for every call unless it is given a
``connect=`` factory; a pool's ``connection`` context manager is the factory its
README's "bring your own connection" pattern calls for, so the bench uses one (a new
TCP connection per job would measure connection setup, not the library).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from ..env import Database
from ..results import Sample


class DeferjobPeer:
    label = "deferjob"

    def __init__(self, db: Database) -> None:
        import psycopg_pool
        from deferjob import Defer, Job

        assert db.dsn is not None
        self.dsn = db.dsn
        self.pool: Any = psycopg_pool.ConnectionPool(db.dsn, min_size=1, max_size=4, open=True)
        self.jobs = Defer(connect=self.pool.connection)
        self.ran = 0

        @self.jobs.job("noop")
        def noop(job: Job) -> None:
            self.ran += 1

        self.jobs.install()

    def enqueue_each(self, count: int, delay_seconds: float) -> int:
        run_at = datetime.now(UTC) + timedelta(seconds=delay_seconds)
        for n in range(count):
            self.jobs.schedule("noop", run_at=run_at, payload={"n": n})
        return count

    def enqueue_bulk(self, count: int, delay_seconds: float) -> int:
        # No bulk API: the equivalent is every schedule() on one connection, one commit.
        run_at = datetime.now(UTC) + timedelta(seconds=delay_seconds)
        with self.pool.connection() as conn:
            for n in range(count):
                self.jobs.schedule("noop", run_at=run_at, payload={"n": n}, conn=conn)
            conn.commit()
        return count

    def fill_due(self, count: int) -> None:
        with self.pool.connection() as conn:
            conn.execute(
                "INSERT INTO defer_jobs (name, run_at, payload) "
                "SELECT 'noop', now() - interval '5 seconds' + g * interval '1 microsecond',"
                " jsonb_build_object('n', g) FROM generate_series(1, %s) AS g",
                (count,),
            )
            conn.commit()
            conn.execute("ANALYZE defer_jobs")

    def drain(self, expected: int) -> Sample:
        """``run_once()`` claims, runs and completes until nothing is due, then returns."""
        self.ran = 0
        start = time.perf_counter()
        ran = self.jobs.run_once()
        return Sample(int(ran), time.perf_counter() - start)

    def clear(self) -> None:
        with self.pool.connection() as conn:
            conn.execute("TRUNCATE defer_jobs")

    def close(self) -> None:
        self.pool.close()
