"""The start of a job a worker queued: its attempt counted as a handler takes it.

A worker claims more jobs than it has free threads (its prefetch) without counting
their attempts, so a killed worker's queue costs its jobs none; each attempt is
counted here, committed before the handler runs, so a job that kills its worker
still spends it. Threads starting at the same moment share one statement.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, String, bindparam, func, insert, literal_column, select, update

from ..jobs import Job, JobStatus
from ..schema import UTCDateTime
from .history import HistoryStatements
from .records import HistoryEvent

#: In a PostgreSQL statement: this transaction's commit does not wait for the WAL
#: flush (see :meth:`ClaimStatements.start_claimed_many`).
_NO_FLUSH_WAIT_SQL = "set_config('synchronous_commit', 'off', true)"
_NO_FLUSH_WAIT = func.set_config("synchronous_commit", "off", True)


@contextmanager
def _without_flush_wait_sqlite(conn: Connection) -> Iterator[None]:
    """SQLite: the next transaction on *conn* commits without an fsync (WAL, NORMAL).

    The level can only change outside a transaction, so it is set before and put back
    after; a level already below NORMAL is left alone.
    """
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None
    (level,) = dbapi.execute("PRAGMA synchronous").fetchone()
    if int(level) <= 1:
        yield
        return
    dbapi.execute("PRAGMA synchronous = NORMAL")
    try:
        yield
    finally:
        dbapi.execute(f"PRAGMA synchronous = {int(level)}")


class StartStatements(HistoryStatements):
    """Counting a queued job's attempt as it starts, one job or a group at once."""

    def start_claimed(self, job: Job, *, now: datetime, actor: str = "app") -> Job | None:
        """Count the attempt of a job claimed with ``spend_attempt=False``, as it starts.

        Returns the job with its new ``attempts``, or None when this claim no longer
        owns it (its lease lapsed while it waited): then it must not run here. Its
        ``started`` event, by *actor*, is written in the same transaction.
        """
        return self.start_claimed_many([job], now=now, actor=actor)[job.id]

    def start_claimed_many(
        self, jobs: Sequence[Job], *, now: datetime, actor: str = "app"
    ) -> dict[int, Job | None]:
        """:meth:`start_claimed` for several jobs at once: one commit for all of them.

        The commit does not wait for the disk (PostgreSQL: ``synchronous_commit`` off
        for this one transaction; SQLite: ``synchronous = NORMAL`` for it). A start
        only has to survive the *worker's* death, which it does once the database has
        it: a job that kills its worker keeps the attempt spent. A database *server*
        crash (or power loss) within a fraction of a second of the start may forget
        the attempt, and the job, reclaimed, runs again with it uncounted, which
        at-least-once allows. Outcomes still wait for the disk, and the log is written
        in order: a durable outcome makes every start before it durable. Measured:
        the flush was 0.4-1 ms of each start on PostgreSQL with fsync on.

        The worker's threads that start queued jobs at the same moment share it (the
        group start), so a backlog of short jobs costs one commit per group rather
        than one per job. Each row keeps its compare-and-set on the claim token: a
        job whose claim was lost is answered None and must not run.

        PostgreSQL: one autocommit statement over the whole group (the attempts, and
        the ``started`` events by a CTE beside them). It never waits for a row lock
        while holding the group's other rows (that could close a deadlock with an app
        transaction holding two job rows): rows another transaction holds are skipped
        and then started alone, as single starts always were. SQLite: one prebuilt
        UPDATE per job inside one write transaction.
        """
        if not jobs:
            return {}
        if self.is_postgres and len(jobs) > 1:
            return self._start_many_pg(jobs, now, actor)
        if self.is_postgres:
            return {jobs[0].id: self._start_alone_pg(jobs[0], now, actor)}
        stmt = self._start_statement()
        started: dict[int, Job | None] = {}
        events: list[HistoryEvent] = []
        with self.engine.connect() as conn, _without_flush_wait_sqlite(conn), conn.begin():
            for job in jobs:
                params = {"job_id": job.id, "token": job.claim_token, "now": now}
                attempts = conn.execute(stmt, params).scalar()
                started[job.id] = _with_attempts(job, attempts)
                if attempts is not None:
                    events.append(HistoryEvent(job.id, "started", now, actor, int(attempts)))
            self.record_events(conn, events)
        return started

    def _start_many_pg(
        self, jobs: Sequence[Job], now: datetime, actor: str
    ) -> dict[int, Job | None]:
        params = {
            "ids": [job.id for job in jobs],
            "tokens": [job.claim_token for job in jobs],
            "now": now,
            "actor": actor,
        }
        with self.autocommit() as conn:
            answer = {int(r[0]): r[1] for r in conn.exec_driver_sql(self._start_many_sql(), params)}
        started: dict[int, Job | None] = {}
        for job in jobs:
            if job.id not in answer:
                started[job.id] = None  # this claim no longer owns it
            elif answer[job.id] is None:  # held by another transaction: wait for it alone
                started[job.id] = self._start_alone_pg(job, now, actor)
            else:
                started[job.id] = _with_attempts(job, answer[job.id])
        return started

    def _start_alone_pg(self, job: Job, now: datetime, actor: str) -> Job | None:
        """One job's start on PostgreSQL: the UPDATE by primary key, its event by a CTE.

        It costs the server less than the group's unnest join, and it may wait for the
        row's lock, since it holds no other.
        """
        params = {"job_id": job.id, "token": job.claim_token, "now": now, "actor": actor}
        with self.autocommit() as conn:
            return _with_attempts(job, conn.execute(self._start_one_pg(), params).scalar())

    def _start_many_sql(self) -> str:
        """PostgreSQL's group start; answers (id, attempts), attempts NULL for a busy row."""
        cached = self._control_sql.get("start_many_pg")
        if cached is not None:
            return str(cached)
        t = self._quoted_table
        recorded = ""
        if self.history_table is not None:
            quoted = self.engine.dialect.identifier_preparer.format_table(self.history_table)
            recorded = (
                f", recorded AS (INSERT INTO {quoted} (job_id, event, at, actor, attempt)"
                " SELECT id, 'started', %(now)s, %(actor)s, attempts FROM started)"
            )
        sql = self._control_sql["start_many_pg"] = (
            "WITH v AS (SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::text[])"
            " AS v(id, token)),"
            f" mine AS MATERIALIZED (SELECT t.id FROM {t} AS t JOIN v ON t.id = v.id"
            " AND t.claim_token = v.token WHERE t.status = 'running'"
            " FOR UPDATE OF t SKIP LOCKED),"
            f" started AS (UPDATE {t} AS t SET attempts = t.attempts + 1,"
            " updated_at = %(now)s FROM mine WHERE t.id = mine.id"
            " RETURNING t.id, t.attempts)"
            f"{recorded}"
            f" SELECT id, attempts FROM started, (SELECT {_NO_FLUSH_WAIT_SQL}) AS no_wait"
            f" UNION ALL SELECT t.id, NULL FROM {t} AS t JOIN v ON t.id = v.id"
            " AND t.claim_token = v.token WHERE t.status = 'running'"
            " AND t.id NOT IN (SELECT id FROM mine)"
        )
        return sql

    def _start_one_pg(self) -> Any:
        """PostgreSQL's start of one job: its attempt and (by a CTE) its started event."""
        stmt = self._control_sql.get("start_pg")
        if stmt is not None:
            return stmt
        stmt = self._start_statement()
        if self.history_table is not None:
            started = stmt.returning(self.table.c.id).cte("started")
            recorded = (
                insert(self.history_table)
                .from_select(
                    ["job_id", "event", "at", "actor", "attempt"],
                    select(
                        started.c.id,
                        literal_column("'started'"),
                        bindparam("now", type_=UTCDateTime()),
                        bindparam("actor", type_=String()),
                        started.c.attempts,
                    ),
                )
                .cte("recorded")
            )
            stmt = select(started.c.attempts, _NO_FLUSH_WAIT).add_cte(recorded)
        else:
            stmt = stmt.returning(_NO_FLUSH_WAIT)
        self._control_sql["start_pg"] = stmt
        return stmt

    def _start_statement(self) -> Any:
        """The prebuilt UPDATE that counts one queued job's attempt as it starts."""
        stmt = self._control_sql.get("start")
        if stmt is None:
            t = self.table
            # Keeps the claim (token, lease): the job is starting, not settling.
            stmt = self._control_sql["start"] = (
                update(t)
                .where(
                    t.c.id == bindparam("job_id", type_=t.c.id.type),
                    t.c.status == literal_column(f"'{JobStatus.RUNNING.value}'"),
                    t.c.claim_token == bindparam("token", type_=String()),
                )
                .values(attempts=t.c.attempts + 1, updated_at=bindparam("now", type_=UTCDateTime()))
                .returning(t.c.attempts)
            )
        return stmt


def _with_attempts(job: Job, attempts: Any) -> Job | None:
    """*job* with the attempts its start counted, or None if its claim was lost."""
    return None if attempts is None else replace(job, attempts=int(attempts))
