"""The worker's claim and its single-job acknowledgements.

The claim counts each claimed job's attempt and writes its ``started`` event in the
same statement: a worker claims only jobs it starts at once, so there is no separate
start to pay for, and a job that kills its worker has its attempt spent.

The claim commits without waiting for the disk. A claim only has to outlive the
*worker*, which it does once the database has it; a database crash or power loss
within a moment of a claim may forget it (the job, back to pending, runs again with
that attempt uncounted), so a job runs at most ``max_attempts`` plus one time per
database crash during its runs. Outcomes still wait for the disk, and the log is
written in order: a durable outcome makes every claim before it durable.

Acknowledgements are compare-and-set on the claim token, so a worker whose lease
lapsed can never overwrite the outcome of the worker that took the job over.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
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
#: flush (measured: the flush was 0.4-1 ms of every claim with fsync on).
_NO_FLUSH_WAIT = func.set_config("synchronous_commit", "off", True).label("_no_flush_wait")


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
        look_first: bool = True,
    ) -> list[Job]:
        """Atomically move up to *limit* due pending jobs to running and return them.

        PostgreSQL: ``FOR UPDATE SKIP LOCKED`` lets many workers claim side by side
        without ever taking the same row. SQLite: one ``UPDATE ... RETURNING`` inside
        ``BEGIN IMMEDIATE``, serialised by the database's single write lock.

        Each claimed job's attempt is counted and its ``started`` event, by *actor*,
        written with the claim: on PostgreSQL by a data-modifying CTE of the same
        statement, on SQLite by one INSERT for the batch in the same transaction. The
        commit does not wait for the disk (see the module's docstring).

        SQLite looks whether anything is due before taking the write lock, so an idle
        worker never makes the app's writes wait; ``look_first=False`` skips that read
        for a caller whose last claim came back full (a backlog).
        """
        # Long because: its docstring states every backend's rule; the code is one claim
        # transaction (look, claim, history) and its retry after a lost index.
        if self.is_sqlite and look_first:
            # Look before taking the write lock: an idle worker polling an empty
            # backlog must not make every web request's write wait for it.
            next_at = self.next_run_at(queues=queues)
            if next_at is None or next_at > now:
                return []
        stmt = self._claim_statement(tuple(queues) if queues else ())
        params = {"now": now, "limit": limit, "token": token, "lease_until": lease_until}
        if self.is_postgres and self.history_table is not None:
            params["actor"] = actor
        try:
            # PostgreSQL: the claim is one statement, so it runs as its own transaction
            # (no BEGIN and COMMIT round trips); SQLite takes the write lock first.
            with self._claim_transaction() as conn:
                result = conn.execute(stmt, params)
                build = Job.builder(list(result.keys()))
                jobs = [build(row) for row in result]
                if self.is_sqlite:
                    self.record_events(
                        conn,
                        [
                            HistoryEvent(job.id, "started", now, actor, job.attempts)
                            for job in jobs
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
            )
        jobs.sort(key=lambda job: (job.run_at, job.id))
        return jobs

    @contextmanager
    def _claim_transaction(self) -> Iterator[Connection]:
        """PostgreSQL: an autocommit connection; SQLite: the write lock, no fsync."""
        if self.is_postgres:
            with self.autocommit() as conn:
                yield conn
            return
        with self.engine.connect() as conn, _without_flush_wait_sqlite(conn):
            with self.begin_immediate_on(conn):
                yield conn

    def _claim_statement(self, queues: tuple[str, ...]) -> Any:
        """The claim, built once per queue selection; now, limit, token, lease are binds.

        Its parts are kept apart on purpose (the conditions a due row meets, its order)
        so that priorities (``ORDER BY priority, run_at``) and paused queues (one more
        condition) extend this one statement rather than needing a second design.
        """
        key = queues
        cached = self._claim_sql.get(key)
        if cached is not None:
            return cached
        t = self.table
        now = bindparam("now", type_=UTCDateTime())
        # Jobs of a paused queue or name stay pending, unclaimed (store/pauses.py).
        conditions: list[Any] = [self._is_pending(), t.c.run_at <= now, self.paused_condition()]
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
            "attempts": t.c.attempts + 1,
            "claim_token": bindparam("token", type_=String()),
            "lease_expires_at": bindparam("lease_until", type_=UTCDateTime()),
            "updated_at": now,
        }
        if self.is_postgres:
            # A materialised CTE runs the locking SELECT exactly once. As an IN (...)
            # subquery PostgreSQL may re-run it per row, claiming more than *limit*.
            due_cte = due.cte("due").prefix_with("MATERIALIZED")
            stmt = update(t).where(t.c.id == due_cte.c.id).values(values).returning(*t.c)
            if self.history_table is not None:
                stmt = self._claim_recording_started(stmt, now)
            else:
                stmt = stmt.returning(_NO_FLUSH_WAIT)
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
        return select(claimed, _NO_FLUSH_WAIT).add_cte(recorded)

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
