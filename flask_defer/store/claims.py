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

import time
import zlib
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    BindParameter,
    Connection,
    Integer,
    String,
    bindparam,
    func,
    select,
    text,
)
from sqlalchemy.exc import OperationalError

from ..jobs import Job
from .claim_sql import (
    KEYED,
    KEYED_MEMORY,
    claim_update_sql,
)
from .due import DueStatements
from .records import (
    HistoryEvent,
)
from .schema import UTCDateTime

#: Seconds a claim trusts a look that found no keyed job pending.
KEYED_UNSEEN = 0.1


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


class ClaimStatements(DueStatements):
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

        Jobs are taken by priority (lower first), then ``run_at``; a claim takes the due
        jobs of one priority (see ``claim_sql``). Jobs past their ``expires_at``, of
        paused queues or names, and of a ``concurrency_key`` at its limit are left.

        PostgreSQL: ``FOR UPDATE SKIP LOCKED`` lets many workers claim side by side
        without ever taking the same row. SQLite: ``UPDATE ... RETURNING`` inside
        ``BEGIN IMMEDIATE``, serialised by the database's single write lock. Keyed jobs
        are claimed first, by a statement of their own that PostgreSQL serialises with
        a transaction-scoped advisory lock, so two workers never both fill a key's last
        slot.

        Each claimed job's attempt is counted and its ``started`` event, by *actor*,
        written with the claim: on PostgreSQL by a data-modifying CTE of the same
        statement, on SQLite by one INSERT for the batch in the same transaction. The
        commit does not wait for the disk (see the module's docstring).

        SQLite looks whether anything is due before taking the write lock, so an idle
        worker never makes the app's writes wait; ``look_first=False`` skips that read
        for a caller whose last claim came back full (a backlog).
        """
        if self.is_sqlite and look_first:
            # Look before taking the write lock: an idle worker polling an empty
            # backlog must not make every web request's write wait for it.
            next_at = self.next_run_at(queues=queues, now=now)
            if next_at is None or next_at > now:
                return []
        params: dict[str, Any] = {
            "now": now,
            "limit": limit,
            "token": token,
            "lease_until": lease_until,
        }
        if queues:
            params["queues"] = list(queues)
        if self.is_postgres and self.history_table is not None:
            params["actor"] = actor
        try:
            jobs = self._claim_both(params, bool(queues), actor)
        except OperationalError as error:
            if not self._lost_pending_index(error):
                raise
            return self.claim(
                now=now, limit=limit, token=token, lease_until=lease_until,
                queues=queues, actor=actor, look_first=look_first,
            )  # fmt: skip
        jobs.sort(key=lambda job: (job.priority, job.run_at, job.id))
        return jobs

    def _claim_both(self, params: dict[str, Any], queues: bool, actor: str) -> list[Job]:
        """The keyed claim (when keyed jobs are about), then the batch claim for the rest.

        Keyed jobs go first: they are the ones a limit holds back, so a backlog of
        unkeyed jobs filling every claim must not starve them.
        """
        limit = params["limit"]
        jobs: list[Job] = []
        if self.is_postgres:
            # The keyed claim needs a real transaction (its advisory lock lasts until
            # the commit); the look and the batch claim are single autocommit statements.
            with self.autocommit() as conn:
                keyed = self._keyed_in_play(conn)
            if keyed:
                with self.engine.begin() as conn:
                    conn.execute(self._keyed_lock_statement())
                    jobs = self._run_claim(conn, "keyed", queues, params)
            with self.autocommit() as conn:
                if len(jobs) < limit:
                    rest = {**params, "limit": limit - len(jobs)}
                    jobs += self._run_claim(conn, "due", queues, rest)
        else:
            with self._claim_transaction() as conn:
                if self._keyed_in_play(conn):
                    jobs = self._run_claim(conn, "keyed", queues, params)
                if len(jobs) < limit:
                    rest = {**params, "limit": limit - len(jobs)}
                    jobs += self._run_claim(conn, "due", queues, rest)
                at = params["now"]
                started = [HistoryEvent(job.id, "started", at, actor, job.attempts) for job in jobs]
                self.record_events(conn, started)
        if any(job.concurrency_key is not None for job in jobs):
            self.keyed_scheduled()
        return jobs

    def _run_claim(
        self, conn: Connection, kind: str, queues: bool, params: dict[str, Any]
    ) -> list[Job]:
        if self.is_postgres:
            sql, build = self._driver_claim(kind, queues, params["limit"])
            return [build(row) for row in conn.exec_driver_sql(sql, params)]
        result = conn.execute(self._claim_statement(kind, queues, params["limit"]), params)
        # Every claim statement returns the table's columns: one builder for them all.
        make = self._claim_sql.get(("builder", False, None))
        if make is None:
            make = self._claim_sql[("builder", False, None)] = Job.builder(list(result.keys()))
        return [make(row) for row in result]

    def _driver_claim(
        self, kind: str, queues: bool, limit: int
    ) -> tuple[str, Callable[[Sequence[Any]], Job]]:
        """PostgreSQL: the claim's text for the driver and the builder of its rows.

        Run with ``exec_driver_sql``: SQLAlchemy still checks the connection out, wraps
        errors and notices a lost connection, but neither binds nor types the values
        (profiled: its result processing of a claim's 28 columns cost more than the
        claim's own round trip under load). The driver already returns aware datetimes
        and parsed JSON; the builder turns the datetimes to UTC, as the column type would.
        """
        key = (f"driver-{kind}", queues, limit)
        cached = self._claim_sql.get(key)
        if cached is None:
            statement = self._claim_statement(kind, queues, limit)
            sql = str(statement.compile(dialect=self.engine.dialect))
            names = [c.name for c in self.table.c]
            stamps = [c.name for c in self.table.c if isinstance(c.type, UTCDateTime)]
            cached = self._claim_sql[key] = (sql, Job.builder(names, to_utc=stamps))
        return cast("tuple[str, Callable[[Sequence[Any]], Job]]", cached)

    def _keyed_in_play(self, conn: Connection) -> bool:
        """Whether keyed jobs may be pending: a claim saw some (or this process scheduled
        one) lately, else one step into the keyed pending index.

        A "none" answer is trusted for a tenth of a second, so a busy worker pays for the
        look (a round trip on PostgreSQL) about ten times a second rather than once per
        claim; a keyed job scheduled by another process meanwhile waits that long at most.
        """
        moment = time.monotonic()
        if moment < self._keyed_until:
            return True
        if moment < self._keyed_unseen_until:
            return False
        found = conn.execute(self._keyed_probe()).first() is not None
        if found:
            self._keyed_until = moment + KEYED_MEMORY
        else:
            self._keyed_unseen_until = moment + KEYED_UNSEEN
        return found

    def _keyed_probe(self) -> Any:
        cached = self._claim_sql.get(("keyed-probe", False, None))
        if cached is None:
            tables = self.claim_tables()
            sql = f"SELECT 1 FROM {tables.jobs}{tables.keyed_hint} WHERE {KEYED} LIMIT 1"
            cached = self._claim_sql[("keyed-probe", False, None)] = text(sql)
        return cached

    def _keyed_lock_statement(self) -> Any:
        """PostgreSQL: the advisory lock that serialises keyed claims of this table."""
        lock = zlib.crc32(f"flask_defer:keyed:{self.table.name}".encode())
        return select(func.pg_advisory_xact_lock(lock))

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

    def _claim_statement(self, kind: str, queues: bool, limit: int) -> Any:
        """The claim of *kind* (``due`` or ``keyed``) of up to *limit* jobs, built once.

        The ids come from ``claim_sql``; around them the UPDATE that starts the jobs,
        and on PostgreSQL the ``started`` events and the commit that does not wait for
        the disk, all in the same statement. Every value is a bind, except on
        PostgreSQL the limit: one statement per limit lets the server keep one plan
        for it (``claim_sql.limit_sql``).
        """
        key = (kind, queues, limit if self.is_postgres else None)
        cached = self._claim_sql.get(key)
        if cached is not None:
            return cached
        # Named, in the metadata's order: the result's columns are typed by position, and
        # a table grown by revisions has its columns in another order than a new one.
        quote = self.engine.dialect.identifier_preparer.quote
        history = (
            self.engine.dialect.identifier_preparer.format_table(self.history_table)
            if self.is_postgres and self.history_table is not None
            else None
        )
        sql = claim_update_sql(
            self.claim_tables(),
            keyed=kind == "keyed",
            queues=queues,
            postgres=self.is_postgres,
            columns=[quote(c.name) for c in self.table.c],
            history=history,
            limit=limit if self.is_postgres else None,
        )
        binds: list[BindParameter[Any]] = [
            bindparam("now", type_=UTCDateTime()),
            bindparam("token", type_=String()),
            bindparam("lease_until", type_=UTCDateTime()),
        ]
        if not self.is_postgres:
            binds.append(bindparam("limit", type_=Integer()))
        if queues:
            # PostgreSQL: one array (``= ANY``), so the text is the same for any queues.
            binds.append(bindparam("queues", expanding=not self.is_postgres))
        if self.is_postgres and self.history_table is not None:
            binds.append(bindparam("actor", type_=String()))
        stmt = text(sql).bindparams(*binds).columns(*self.table.c)
        self._claim_sql[key] = stmt
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
