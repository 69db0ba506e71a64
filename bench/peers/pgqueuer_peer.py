"""pgqueuer (PostgreSQL) in its fastest documented configuration: the asyncpg driver.

pgqueuer is asyncio-first and documents asyncpg as its primary driver
(``pip install pgqueuer[asyncpg]``); its psycopg driver drains about a third as fast
here, so a user choosing pgqueuer for speed runs asyncpg, and so does this bench.
The drain runs ``PgQueuer.from_asyncpg_connection(...).qm.run(mode=drain)`` with its
defaults (batch size 10), which returns once the queue is empty. Enqueueing uses
``Queries.enqueue`` (one or lists) on an asyncpg connection, awaited one call at a
time (each single enqueue is its own transaction, like the others' ``schedule()`` +
commit).
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from typing import Any

from ..env import Database
from ..results import Sample


class PgqueuerPeer:
    label = "pgqueuer (asyncpg)"

    def __init__(self, db: Database) -> None:
        import psycopg

        assert db.dsn is not None
        self.dsn = db.dsn
        logging.getLogger("pgqueuer").setLevel(logging.WARNING)
        # One event loop for the peer's lifetime, so its asyncpg connection is reused
        # across calls as an application's would be.
        self.loop = asyncio.new_event_loop()
        self.conn: Any = self.loop.run_until_complete(self._connect())
        self.queries: Any = self._queries(self.conn)
        self.loop.run_until_complete(self.queries.install())
        # Reads and truncates of the bench itself (not timed).
        self.sync_conn: Any = psycopg.connect(db.dsn, autocommit=True)
        self.ran = 0

    async def _connect(self) -> Any:
        import asyncpg

        return await asyncpg.connect(_asyncpg_dsn(self.dsn))

    @staticmethod
    def _queries(conn: Any) -> Any:
        from pgqueuer.queries import Queries

        return Queries.from_asyncpg_connection(conn)

    def enqueue_each(self, count: int, delay_seconds: float) -> int:
        after = timedelta(seconds=delay_seconds)

        async def each() -> None:
            for n in range(count):
                await self.queries.enqueue("noop", str(n).encode(), execute_after=after)

        self.loop.run_until_complete(each())
        return count

    def enqueue_bulk(self, count: int, delay_seconds: float) -> int:
        after = timedelta(seconds=delay_seconds)
        ids = self.loop.run_until_complete(
            self.queries.enqueue(
                ["noop"] * count,
                [str(n).encode() for n in range(count)],
                [0] * count,
                [after] * count,
            )
        )
        return len(ids)

    def fill_due(self, count: int) -> None:
        step = 5000
        for start in range(0, count, step):
            size = min(count, start + step) - start
            self.loop.run_until_complete(
                self.queries.enqueue(
                    ["noop"] * size, [str(start + n).encode() for n in range(size)], [0] * size
                )
            )
        self.sync_conn.execute("ANALYZE")

    def drain(self, expected: int) -> Sample:
        """From the call to the last acknowledgement pgqueuer logged.

        ``run(mode=drain)`` returns only after its buffers and background tasks wind down
        (seconds after the last job); the last ``successful`` row of its log is when the
        work was done, which is what the other contenders are timed to.
        """
        self.ran = 0
        start = time.time()
        self.loop.run_until_complete(self._drain())
        row = self.sync_conn.execute(
            "SELECT extract(epoch FROM max(created)), count(*) FROM pgqueuer_log"
            " WHERE status = 'successful' AND created >= to_timestamp(%s)",
            (start,),
        ).fetchone()
        last, logged = float(row[0] or 0), int(row[1])
        if logged != expected:
            raise RuntimeError(f"pgqueuer logged {logged} successful jobs of {expected}")
        return Sample(self.ran, last - start)

    async def _drain(self) -> None:
        from pgqueuer import PgQueuer
        from pgqueuer.models import Job
        from pgqueuer.types import QueueExecutionMode

        # A connection of its own, as a pgqueuer worker process has (LISTEN included).
        conn = await self._connect()
        try:
            pgq = PgQueuer.from_asyncpg_connection(conn)

            @pgq.entrypoint("noop")
            async def noop(job: Job) -> None:
                self.ran += 1

            await pgq.qm.run(mode=QueueExecutionMode.drain)
        finally:
            await conn.close()

    def clear(self) -> None:
        self.sync_conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")

    def close(self) -> None:
        self.sync_conn.close()
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()


def _asyncpg_dsn(libpq: str) -> str:
    """asyncpg takes a URL, not libpq's ``key=value`` string."""
    parts = dict(item.split("=", 1) for item in libpq.split())
    return (
        f"postgresql://{parts.get('user', 'postgres')}@{parts.get('host', '127.0.0.1')}"
        f":{parts.get('port', '5432')}/{parts['dbname']}"
    )
