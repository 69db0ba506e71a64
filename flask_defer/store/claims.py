"""The worker's claim and its single-job acknowledgements.

Acknowledgements are compare-and-set on the claim token, so a worker whose lease
lapsed can never overwrite the outcome of the worker that took the job over.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    String,
    bindparam,
    func,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.exc import OperationalError

from ..jobs import Job, JobStatus
from ..schema import UTCDateTime
from .history import HistoryStatements
from .records import (
    HistoryEvent,
)

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


class ClaimStatements(HistoryStatements):
    """The worker's claim and its single-job acknowledgements."""

    def claim(
        self,
        *,
        now: datetime,
        limit: int,
        token: str,
        lease_until: datetime,
        queues: Collection[str] | None = None,
        actor: str = "app",
        spend_attempt: bool = True,
    ) -> list[Job]:
        """Atomically move up to *limit* due pending jobs to running and return them.

        PostgreSQL: ``FOR UPDATE SKIP LOCKED`` lets many workers claim side by side
        without ever taking the same row. SQLite: one ``UPDATE ... RETURNING`` inside
        ``BEGIN IMMEDIATE``, serialised by the database's single write lock.

        ``spend_attempt=False`` claims without counting an attempt: for jobs a worker
        queues beside its running ones, whose attempt :meth:`start_claimed` counts
        when a handler really starts. A worker killed before that leaves them with
        their attempts untouched.
        Each claimed job's ``started`` event, by *actor*, is written with the claim
        (only a claim that spends the attempt; :meth:`start_claimed` writes it for the
        others): on PostgreSQL by a data-modifying CTE of the same statement, on SQLite
        by one INSERT for the batch in the same transaction.
        """
        # Long because: its docstring states every backend's rule; the code is one claim
        # transaction (look, claim, history) and its retry after a lost index.
        if self.is_sqlite:
            # Look before taking the write lock: an idle worker polling an empty
            # backlog must not make every web request's write wait for it.
            next_at = self.next_run_at(queues=queues)
            if next_at is None or next_at > now:
                return []
        stmt = self._claim_statement(tuple(queues) if queues else (), spend_attempt)
        params = {"now": now, "limit": limit, "token": token, "lease_until": lease_until}
        if self.is_postgres and self.history_table is not None and spend_attempt:
            params["actor"] = actor
        try:
            # PostgreSQL: the claim is one statement, so it runs as its own transaction
            # (no BEGIN and COMMIT round trips); SQLite takes the write lock first.
            with self.autocommit() if self.is_postgres else self.begin_immediate() as conn:
                rows = conn.execute(stmt, params).mappings().all()
                if self.is_sqlite and spend_attempt:
                    self.record_events(
                        conn,
                        [
                            HistoryEvent(row["id"], "started", now, actor, row["attempts"])
                            for row in rows
                        ],
                    )
        except OperationalError as error:
            if not self._lost_pending_index(error):
                raise
            return self.claim(
                now=now,
                limit=limit,
                token=token,
                lease_until=lease_until,
                queues=queues,
                actor=actor,
                spend_attempt=spend_attempt,
            )
        jobs = [Job.from_row(row) for row in rows]
        jobs.sort(key=lambda job: (job.run_at, job.id))
        return jobs

    def _claim_statement(self, queues: tuple[str, ...], spend_attempt: bool = True) -> Any:
        """The claim, built once per queue selection; now, limit, token, lease are binds.

        Its parts are kept apart on purpose (the conditions a due row meets, its order)
        so that priorities (``ORDER BY priority, run_at``) and paused queues (one more
        condition) extend this one statement rather than needing a second design.
        """
        key = (queues, spend_attempt)
        cached = self._claim_sql.get(key)
        if cached is not None:
            return cached
        t = self.table
        now = bindparam("now", type_=UTCDateTime())
        conditions: list[Any] = [self._is_pending(), t.c.run_at <= now]
        if queues:
            conditions.append(t.c.queue.in_(list(queues)))
        order = [t.c.run_at, t.c.id]
        due: Any = (
            select(t.c.id)
            .where(*conditions)
            .order_by(*order)
            .limit(bindparam("limit", type_=Integer()))
            .with_for_update(skip_locked=True)
        )
        if self.is_sqlite and self._sqlite_pending_index is not None:
            due = self._sqlite_due_ids(None, None, queues)
        values = {
            "status": JobStatus.RUNNING.value,
            "attempts": t.c.attempts + 1 if spend_attempt else t.c.attempts,
            "claim_token": bindparam("token", type_=String()),
            "lease_expires_at": bindparam("lease_until", type_=UTCDateTime()),
            "updated_at": now,
        }
        if self.is_postgres:
            # A materialised CTE runs the locking SELECT exactly once. As an IN (...)
            # subquery PostgreSQL may re-run it per row, claiming more than *limit*.
            due_cte = due.cte("due").prefix_with("MATERIALIZED")
            stmt = update(t).where(t.c.id == due_cte.c.id).values(values).returning(*t.c)
            if self.history_table is not None and spend_attempt:
                stmt = self._claim_recording_started(stmt, now)
        else:
            # No second "status = 'pending'" test on the outer UPDATE: the subquery
            # picks pending rows inside the same BEGIN IMMEDIATE transaction, which no
            # other writer can interleave with, and the extra term made SQLite walk
            # every pending row through the status index instead of looking the
            # chosen ids up by rowid.
            stmt = update(t).where(t.c.id.in_(due)).values(values).returning(*t.c)
        self._claim_sql[key] = stmt
        return stmt

    def _claim_recording_started(self, claim: Any, now: Any) -> Any:
        """PostgreSQL: the claim as a CTE, its rows' ``started`` events inserted beside it.

        ``WITH claimed AS (UPDATE ... RETURNING *), recorded AS (INSERT INTO history
        SELECT ... FROM claimed) SELECT * FROM claimed``: still one autocommit statement,
        so history costs the claim no extra round trip and cannot part from it.
        """
        h = self.history_table
        assert h is not None
        claimed = claim.cte("claimed")
        recorded = (
            insert(h)
            .from_select(
                ["job_id", "event", "at", "actor", "attempt"],
                select(
                    claimed.c.id,
                    literal_column("'started'"),
                    now,
                    bindparam("actor", type_=String()),
                    claimed.c.attempts,
                ),
            )
            .cte("recorded")
        )
        return select(claimed).add_cte(recorded)

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
            # A group of one: the UPDATE by primary key (its event by a CTE) costs the
            # server less than the group's unnest join, and it may wait for the row's
            # lock, since it holds no other.
            job = jobs[0]
            params = {"job_id": job.id, "token": job.claim_token, "now": now, "actor": actor}
            with self.autocommit() as conn:
                value = conn.execute(self._start_one_pg(), params).scalar()
            return {job.id: None if value is None else replace(job, attempts=int(value))}
        stmt = self._start_statement()
        started: dict[int, Job | None] = {}
        events: list[HistoryEvent] = []
        with self.engine.connect() as conn, _without_flush_wait_sqlite(conn), conn.begin():
            for job in jobs:
                params = {"job_id": job.id, "token": job.claim_token, "now": now}
                attempts = conn.execute(stmt, params).scalar()
                started[job.id] = None if attempts is None else replace(job, attempts=int(attempts))
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
                continue
            attempts = answer[job.id]
            if attempts is None:  # held by another transaction: wait for it alone
                single = {"job_id": job.id, "token": job.claim_token, "now": now}
                with self.begin() as conn:
                    attempts = conn.execute(self._start_statement(), single).scalar()
                    if attempts is not None:
                        event = HistoryEvent(job.id, "started", now, actor, int(attempts))
                        self.record_events(conn, [event])
            started[job.id] = None if attempts is None else replace(job, attempts=int(attempts))
        return started

    def _start_many_sql(self) -> str:
        """PostgreSQL's group start; answers (id, attempts), attempts NULL for a busy row."""
        sql = self._ack_sql.get("start")
        if sql is not None:
            return sql
        t = self._quoted_table
        recorded = ""
        if self.history_table is not None:
            quoted = self.engine.dialect.identifier_preparer.format_table(self.history_table)
            recorded = (
                f", recorded AS (INSERT INTO {quoted} (job_id, event, at, actor, attempt)"
                " SELECT id, 'started', %(now)s, %(actor)s, attempts FROM started)"
            )
        sql = self._ack_sql["start"] = (
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

    def ack_done(
        self,
        job: Job,
        *,
        now: datetime,
        result: Any = None,
        conn: Connection | None = None,
        actor: str = "app",
        note: str | None = None,
    ) -> bool:
        """Mark a claimed job done; False if this claim no longer owns it.

        Pass *conn* to commit the mark together with the handler's own database work
        (``atomic=True`` handlers). *note* is kept as ``last_error`` (a warning about
        a run that succeeded).
        """
        event = HistoryEvent(job.id, "done", now, actor, job.attempts, note)
        params = {"v_last_error": note, "v_result": result}
        return self._acknowledge(job, "done", params, now=now, event=event, conn=conn)

    def ack_retry(
        self, job: Job, *, now: datetime, run_at: datetime, error: str, actor: str = "app"
    ) -> bool:
        """Return a claimed job to pending at *run_at* after a failed attempt."""
        event = HistoryEvent(job.id, "retried", now, actor, job.attempts, error, run_at)
        params = {"v_run_at": run_at, "v_last_error": error}
        return self._acknowledge(job, "retry", params, now=now, event=event)

    def ack_failed(self, job: Job, *, now: datetime, error: str, actor: str = "app") -> bool:
        """Settle a claimed job as failed (out of attempts): the dead letter."""
        event = HistoryEvent(job.id, "failed", now, actor, job.attempts, error)
        return self._acknowledge(job, "failed", {"v_last_error": error}, now=now, event=event)

    def ack_snooze(
        self,
        job: Job,
        *,
        now: datetime,
        run_at: datetime,
        note: str | None,
        still_owed: bool,
        actor: str = "app",
    ) -> bool:
        """Return a claimed job to pending at *run_at* without spending its attempt.

        ``still_owed`` keeps ``due_at`` (the job is late, e.g. its handler is not
        deployed yet); otherwise the job counts as due only from *run_at* (``NotYet``).
        """
        event = HistoryEvent(job.id, "snoozed", now, actor, job.attempts, note, run_at)
        params = {"v_run_at": run_at, "v_due_at": run_at, "v_last_error": note}
        kind = "snooze" if still_owed else "snooze_due"
        if still_owed:
            del params["v_due_at"]
        return self._acknowledge(job, kind, params, now=now, event=event)
