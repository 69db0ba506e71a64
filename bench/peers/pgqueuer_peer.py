"""pgqueuer (PostgreSQL): ``Queries.enqueue`` (one or lists) and ``QueueManager.run``.

pgqueuer is asyncio-first; the enqueue side uses its synchronous ``SyncQueries`` over a
psycopg autocommit connection (so each single enqueue is its own transaction, like the
others' ``schedule()``+commit). The drain runs ``QueueManager.run(mode=drain)`` with its
defaults (batch size 10), which returns once the queue is empty.
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
    label = "pgqueuer"

    def __init__(self, db: Database) -> None:
        import psycopg
        from pgqueuer.db import SyncPsycopgDriver
        from pgqueuer.queries import SyncQueries

        assert db.dsn is not None
        self.dsn = db.dsn
        logging.getLogger("pgqueuer").setLevel(logging.WARNING)
        asyncio.run(self._install())
        self.sync_conn: Any = psycopg.connect(db.dsn, autocommit=True)
        self.queries: Any = SyncQueries(SyncPsycopgDriver(self.sync_conn))
        self.ran = 0

    async def _install(self) -> None:
        import psycopg
        from pgqueuer.db import PsycopgDriver
        from pgqueuer.queries import Queries

        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            await Queries(PsycopgDriver(conn)).install()

    def enqueue_each(self, count: int, delay_seconds: float) -> int:
        after = timedelta(seconds=delay_seconds)
        for n in range(count):
            self.queries.enqueue("noop", str(n).encode(), execute_after=after)
        return count

    def enqueue_bulk(self, count: int, delay_seconds: float) -> int:
        after = timedelta(seconds=delay_seconds)
        ids = self.queries.enqueue(
            ["noop"] * count,
            [str(n).encode() for n in range(count)],
            [0] * count,
            [after] * count,
        )
        return len(ids)

    def fill_due(self, count: int) -> None:
        step = 5000
        for start in range(0, count, step):
            size = min(count, start + step) - start
            self.queries.enqueue(
                ["noop"] * size, [str(start + n).encode() for n in range(size)], [0] * size
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
        asyncio.run(self._drain())
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
        import psycopg
        from pgqueuer import QueueManager
        from pgqueuer.db import PsycopgDriver
        from pgqueuer.models import Job
        from pgqueuer.queries import Queries
        from pgqueuer.types import QueueExecutionMode

        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            qm = QueueManager(Queries(PsycopgDriver(conn)))

            @qm.entrypoint("noop")
            async def noop(job: Job) -> None:
                self.ran += 1

            await qm.run(mode=QueueExecutionMode.drain)

    def clear(self) -> None:
        self.sync_conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")

    def close(self) -> None:
        self.sync_conn.close()
