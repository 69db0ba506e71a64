"""Every SQL statement of flask_defer, for SQLite and PostgreSQL, and nothing of Flask.

The store is driven with a bare SQLAlchemy engine, so it can be tested and benchmarked
without an app. Statements that must be atomic are single guarded statements
(``UPDATE ... WHERE status = 'pending'``), never a read followed by a write: that is
what makes "the user's cancel wins or the worker's claim wins, never both" true.

Methods that take a ``conn`` run inside the caller's transaction (so scheduling can
join the application's ``db.session``); the others open a short transaction of their
own. All times are passed in (``now=``) so tests can drive the clock.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Connection,
    Engine,
    Integer,
    String,
    Table,
    Text,
    and_,
    bindparam,
    case,
    cast,
    column,
    delete,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    text,
    type_coerce,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import OperationalError

from .errors import JobExists
from .jobs import Job, JobStatus
from .schema import LIVE_STATUSES, UTCDateTime

logger = logging.getLogger("flask_defer")

#: PostgreSQL channel a scheduling transaction notifies; workers LISTEN on it.
NOTIFY_CHANNEL = "flask_defer"

#: How ``last_error`` starts on a job left pending because no worker knew its name;
#: health counts these even when the process asking knows the name.
UNKNOWN_HANDLER_NOTE = "no handler registered"


@dataclass(frozen=True, slots=True)
class NewJob:
    """What ``schedule()`` asks the store to write, already validated and normalised."""

    name: str
    payload: Any
    run_at: datetime
    max_attempts: int
    queue: str = "default"
    key: str | None = None
    owner: str | None = None
    label: str | None = None
    undo_until: datetime | None = None


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Conditions of ``list`` and the bulk operations; ``None`` means "any"."""

    statuses: tuple[JobStatus, ...] | None = None
    name: str | None = None
    key_prefix: str | None = None
    owner: str | None = None
    queue: str | None = None


@dataclass(frozen=True, slots=True)
class StatusCounts:
    """Figures the health report is built from, for one job name or (``name=None``) all."""

    name: str | None
    by_status: dict[str, int]
    scheduled: int
    owed: int
    oldest_owed_due_at: datetime | None
    lapsed_leases: int

    @classmethod
    def total(cls, parts: Sequence[StatusCounts]) -> StatusCounts:
        """Sum per-name figures into one."""
        oldest = [p.oldest_owed_due_at for p in parts if p.oldest_owed_due_at is not None]
        return cls(
            name=None,
            by_status={s.value: sum(p.by_status.get(s.value, 0) for p in parts) for s in JobStatus},
            scheduled=sum(p.scheduled for p in parts),
            owed=sum(p.owed for p in parts),
            oldest_owed_due_at=min(oldest) if oldest else None,
            lapsed_leases=sum(p.lapsed_leases for p in parts),
        )


class JobStore:
    """All reads and writes of the jobs table, over one engine."""

    def __init__(self, engine: Engine, table: Table) -> None:
        self.engine = engine
        self.table = table
        self.is_postgres = engine.dialect.name == "postgresql"
        self.is_sqlite = engine.dialect.name == "sqlite"
        if not (self.is_postgres or self.is_sqlite):
            raise ValueError(
                f"flask_defer supports SQLite and PostgreSQL, not {engine.dialect.name!r}"
            )
        # SQLite: the partial index the poll and the claim name explicitly (see
        # _sqlite_pending_scan); None if this table has no such index.
        pending_index = f"ix_{table.name}_pending_run_at"
        self._sqlite_pending_index: str | None = (
            pending_index if any(ix.name == pending_index for ix in table.indexes) else None
        )

    # -- transactions -------------------------------------------------------------

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A short transaction of the store's own, committed on success."""
        with self.engine.begin() as conn:
            yield conn

    @contextmanager
    def begin_immediate(self) -> Iterator[Connection]:
        """A write transaction that takes SQLite's write lock up front.

        On SQLite a deferred transaction that reads first and writes later can fail
        with "database is locked" without waiting; ``BEGIN IMMEDIATE`` waits for the
        lock (busy timeout) instead. PostgreSQL needs nothing special.
        """
        if not self.is_sqlite:
            with self.engine.begin() as conn:
                yield conn
            return
        with self.engine.connect() as conn:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.rollback()
                raise
            conn.commit()

    def create_table(self) -> None:
        """Create the table and its indexes if they do not exist (``flask defer install``)."""
        self.table.create(self.engine, checkfirst=True)

    # -- scheduling ---------------------------------------------------------------

    def insert(self, conn: Connection, new: NewJob, *, now: datetime, replace: bool) -> Job:
        """Insert one job in the caller's transaction and return it.

        With a key, ``ON CONFLICT DO NOTHING`` against the live-key index turns a taken
        key into :class:`JobExists` without an integrity error, which on PostgreSQL
        would abort the caller's whole transaction. ``replace`` first cancels the
        pending holder of the key (a running one cannot be replaced).
        """
        t = self.table
        values = self._row_values(new, now)
        if new.key is None:
            row = conn.execute(insert(t).values(values).returning(*t.c)).mappings().one()
        else:
            if replace:
                conn.execute(
                    update(t)
                    .where(t.c.key == new.key, t.c.status == JobStatus.PENDING.value)
                    .values(self._settle_values(JobStatus.CANCELLED, now))
                )
            dialect_insert = postgresql.insert if self.is_postgres else sqlite.insert
            stmt = (
                dialect_insert(t)
                .values(values)
                .on_conflict_do_nothing(
                    index_elements=[t.c.key],
                    # Literal values, not bound parameters: once psycopg prepares the
                    # statement (from its 6th run on a connection), PostgreSQL cannot
                    # match "status IN ($1, $2)" to the partial index and refuses it.
                    index_where=t.c.status.in_(
                        [literal_column(f"'{status}'") for status in LIVE_STATUSES]
                    ),
                )
                .returning(*t.c)
            )
            found = conn.execute(stmt).mappings().first()
            if found is None:
                holder = conn.execute(
                    select(t.c.id).where(t.c.key == new.key, t.c.status.in_(LIVE_STATUSES))
                ).scalar()
                raise JobExists(new.key, holder)
            row = found
        self.notify(conn, new.queue)
        return Job.from_row(row)

    def insert_many(self, conn: Connection, jobs: Sequence[NewJob], *, now: datetime) -> int:
        """Insert many keyless jobs in one statement batch (the bulk enqueue path)."""
        if not jobs:
            return 0
        conn.execute(insert(self.table), [self._row_values(job, now) for job in jobs])
        for queue in {job.queue for job in jobs}:
            self.notify(conn, queue)
        return len(jobs)

    def notify(self, conn: Connection, queue: str) -> None:
        """Wake PostgreSQL workers when the caller's transaction commits (no-op on SQLite)."""
        if self.is_postgres:
            conn.execute(select(func.pg_notify(NOTIFY_CHANNEL, queue)))

    @staticmethod
    def _row_values(new: NewJob, now: datetime) -> dict[str, Any]:
        return {
            "name": new.name,
            "queue": new.queue,
            "key": new.key,
            "payload": new.payload,
            "status": JobStatus.PENDING.value,
            "run_at": new.run_at,
            "due_at": new.run_at,
            "attempts": 0,
            "max_attempts": new.max_attempts,
            "owner": new.owner,
            "label": new.label,
            "undo_until": new.undo_until,
            "created_at": now,
            "updated_at": now,
        }

    # -- control (guarded single statements) --------------------------------------

    def cancel(
        self,
        conn: Connection,
        *,
        now: datetime,
        job_id: int | None = None,
        key: str | None = None,
        owner: str | None = None,
    ) -> Job | None:
        """Cancel the pending job with this id or key; ``None`` if none was pending.

        ``owner`` narrows the guard so a user can only ever cancel their own job, even
        if they guess another id.
        """
        t = self.table
        stmt = (
            update(t)
            .where(self._identity(job_id, key), t.c.status == JobStatus.PENDING.value)
            .values(self._settle_values(JobStatus.CANCELLED, now))
            .returning(*t.c)
        )
        if owner is not None:
            stmt = stmt.where(t.c.owner == owner)
        row = conn.execute(stmt).mappings().first()
        return Job.from_row(row) if row is not None else None

    def cancel_many(self, conn: Connection, where: JobFilter, *, now: datetime) -> tuple[int, int]:
        """Cancel every pending job matching *where*; return (cancelled, still running)."""
        t = self.table
        condition = self._filter(where)
        cancelled = conn.execute(
            update(t)
            .where(condition, t.c.status == JobStatus.PENDING.value)
            .values(self._settle_values(JobStatus.CANCELLED, now))
        ).rowcount
        in_flight = conn.execute(
            select(func.count())
            .select_from(t)
            .where(condition, t.c.status == JobStatus.RUNNING.value)
        ).scalar_one()
        return int(cancelled), int(in_flight)

    def reschedule(
        self,
        conn: Connection,
        run_at: datetime,
        *,
        now: datetime,
        job_id: int | None = None,
        key: str | None = None,
    ) -> Job | None:
        """Move a pending job to *run_at*; ``None`` if no job with this id/key is pending."""
        t = self.table
        row = (
            conn.execute(
                update(t)
                .where(self._identity(job_id, key), t.c.status == JobStatus.PENDING.value)
                .values(run_at=run_at, due_at=run_at, updated_at=now)
                .returning(*t.c)
            )
            .mappings()
            .first()
        )
        if row is not None:
            # Moved earlier ("run now"), it must not wait for a worker's timed wake.
            self.notify(conn, row["queue"])
        return Job.from_row(row) if row is not None else None

    def retry_failed(self, conn: Connection, job_id: int, *, now: datetime) -> Job | None:
        """Put a failed job back to pending, due now, with its attempts reset."""
        t = self.table
        row = (
            conn.execute(
                update(t)
                .where(t.c.id == job_id, t.c.status == JobStatus.FAILED.value)
                .values(
                    status=JobStatus.PENDING.value,
                    attempts=0,
                    run_at=now,
                    due_at=now,
                    finished_at=None,
                    updated_at=now,
                )
                .returning(*t.c)
            )
            .mappings()
            .first()
        )
        if row is not None:
            self.notify(conn, row["queue"])
        return Job.from_row(row) if row is not None else None

    # -- reads --------------------------------------------------------------------

    def get(
        self, conn: Connection, *, job_id: int | None = None, key: str | None = None
    ) -> Job | None:
        """The job with this id, or for a key the live holder, else the newest settled one."""
        t = self.table
        stmt = select(t).where(self._identity(job_id, key))
        if job_id is None:
            live_first = case((t.c.status.in_(LIVE_STATUSES), 0), else_=1)
            stmt = stmt.order_by(live_first, t.c.id.desc()).limit(1)
        row = conn.execute(stmt).mappings().first()
        return Job.from_row(row) if row is not None else None

    def find(
        self, conn: Connection, where: JobFilter, *, limit: int, offset: int = 0
    ) -> list[Job]:
        """Jobs matching *where*, newest first."""
        t = self.table
        stmt = select(t).where(self._filter(where)).order_by(t.c.id.desc()).limit(limit)
        if offset:
            stmt = stmt.offset(offset)
        return [Job.from_row(row) for row in conn.execute(stmt).mappings()]

    def count(self, conn: Connection, where: JobFilter) -> int:
        """How many jobs match *where*."""
        stmt = select(func.count()).select_from(self.table).where(self._filter(where))
        return int(conn.execute(stmt).scalar_one())

    def counts_by_name(self, conn: Connection, *, now: datetime) -> list[StatusCounts]:
        """Per job name: counts by status, scheduled vs owed, oldest owed, lapsed leases.

        One grouped pass over the table; "owed" is pending-and-due or running, and its
        age is measured from ``due_at``, which retries do not move.
        """
        t = self.table
        pending = t.c.status == JobStatus.PENDING.value
        running = t.c.status == JobStatus.RUNNING.value
        owed = (pending & (t.c.run_at <= now)) | running
        per_status = [func.count().filter(t.c.status == s.value) for s in JobStatus]
        stmt = select(
            t.c.name,
            func.count().filter(pending & (t.c.run_at > now)),
            func.count().filter(owed),
            # type_coerce: SQLite hands aggregates back as text; this parses them.
            type_coerce(func.min(t.c.due_at).filter(owed), UTCDateTime()),
            func.count().filter(running & (t.c.lease_expires_at < now)),
            *per_status,
        ).group_by(t.c.name)
        result = []
        for row in conn.execute(stmt):
            result.append(
                StatusCounts(
                    name=row[0],
                    by_status={s.value: int(n) for s, n in zip(JobStatus, row[5:], strict=True)},
                    scheduled=int(row[1]),
                    owed=int(row[2]),
                    oldest_owed_due_at=row[3],
                    lapsed_leases=int(row[4]),
                )
            )
        return result

    def status_counts(self, conn: Connection, *, now: datetime) -> StatusCounts:
        """The figures of :meth:`counts_by_name`, summed over every name."""
        return StatusCounts.total(self.counts_by_name(conn, now=now))

    def count_unknown(self, conn: Connection, known_names: Collection[str]) -> int:
        """Pending jobs whose name has no handler among *known_names*, or in a worker.

        A worker that met a name it does not know left the job pending with
        :data:`UNKNOWN_HANDLER_NOTE`; those count too, because during a rolling deploy
        the web process may know a name its workers do not know yet.
        """
        t = self.table
        unknown_here = t.c.name.not_in(list(known_names))
        unknown_to_worker = t.c.last_error.startswith(UNKNOWN_HANDLER_NOTE, autoescape=True)
        stmt = (
            select(func.count())
            .select_from(t)
            .where(t.c.status == JobStatus.PENDING.value, unknown_here | unknown_to_worker)
        )
        return int(conn.execute(stmt).scalar_one())

    # -- the Undo UI's reads -------------------------------------------------------

    def undoable_for(
        self, conn: Connection, owner: str, *, now: datetime, limit: int
    ) -> list[Job]:
        """*owner*'s pending jobs whose Undo window is still open, newest window first.

        The repeated ``status IN ('pending', 'running')`` is the predicate of the
        partial owner index; stating it lets SQLite and PostgreSQL use that index for
        a query that runs on every page view.
        """
        t = self.table
        stmt = (
            select(t)
            .where(
                t.c.owner == owner,
                t.c.status.in_(LIVE_STATUSES),
                t.c.status == JobStatus.PENDING.value,
                t.c.undo_until > now,
            )
            .order_by(t.c.undo_until.desc(), t.c.id.desc())
            .limit(limit)
        )
        return [Job.from_row(row) for row in conn.execute(stmt).mappings()]

    def pending_for(self, conn: Connection, owner: str, *, limit: int) -> list[Job]:
        """*owner*'s pending jobs, soonest first (the "pending actions" page)."""
        t = self.table
        stmt = (
            select(t)
            .where(
                t.c.owner == owner,
                t.c.status.in_(LIVE_STATUSES),
                t.c.status == JobStatus.PENDING.value,
            )
            .order_by(t.c.run_at, t.c.id)
            .limit(limit)
        )
        return [Job.from_row(row) for row in conn.execute(stmt).mappings()]

    # -- the worker's side: claim, acknowledge, lease ------------------------------

    def claim(
        self,
        *,
        now: datetime,
        limit: int,
        token: str,
        lease_until: datetime,
        queues: Collection[str] | None = None,
    ) -> list[Job]:
        """Atomically move up to *limit* due pending jobs to running and return them.

        PostgreSQL: ``FOR UPDATE SKIP LOCKED`` lets many workers claim side by side
        without ever taking the same row. SQLite: one ``UPDATE ... RETURNING`` inside
        ``BEGIN IMMEDIATE``, serialised by the database's single write lock.
        """
        t = self.table
        if self.is_sqlite:
            # Look before taking the write lock: an idle worker polling an empty
            # backlog must not make every web request's write wait for it.
            next_at = self.next_run_at(queues=queues)
            if next_at is None or next_at > now:
                return []
        due: Any = (
            select(t.c.id)
            .where(self._is_pending(), t.c.run_at <= now)
            .order_by(t.c.run_at, t.c.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        if queues:
            due = due.where(t.c.queue.in_(list(queues)))
        if self.is_sqlite and self._sqlite_pending_index is not None:
            due = self._sqlite_due_ids(now, limit, queues)
        values = {
            "status": JobStatus.RUNNING.value,
            "attempts": t.c.attempts + 1,
            "claim_token": token,
            "lease_expires_at": lease_until,
            "updated_at": now,
        }
        if self.is_postgres:
            # A materialised CTE runs the locking SELECT exactly once. As an IN (...)
            # subquery PostgreSQL may re-run it per row, claiming more than *limit*.
            due_cte = due.cte("due").prefix_with("MATERIALIZED")
            stmt = update(t).where(t.c.id == due_cte.c.id).values(values).returning(*t.c)
        else:
            # No second "status = 'pending'" test on the outer UPDATE: the subquery
            # picks pending rows inside the same BEGIN IMMEDIATE transaction, which no
            # other writer can interleave with, and the extra term made SQLite walk
            # every pending row through the status index instead of looking the
            # chosen ids up by rowid.
            stmt = update(t).where(t.c.id.in_(due)).values(values).returning(*t.c)
        try:
            with self.begin_immediate() as conn:
                rows = conn.execute(stmt).mappings().all()
        except OperationalError as error:
            if not self._lost_pending_index(error):
                raise
            return self.claim(
                now=now, limit=limit, token=token, lease_until=lease_until, queues=queues
            )
        jobs = [Job.from_row(row) for row in rows]
        jobs.sort(key=lambda job: (job.run_at, job.id))
        return jobs

    def ack_done(
        self,
        job: Job,
        *,
        now: datetime,
        result: Any = None,
        conn: Connection | None = None,
    ) -> bool:
        """Mark a claimed job done; False if this claim no longer owns it.

        Pass *conn* to commit the mark together with the handler's own database work
        (``atomic=True`` handlers).
        """
        values = self._settle_values(JobStatus.DONE, now)
        values.update(last_error=None, result=result)
        return self._acknowledge(job, values, now=now, conn=conn)

    def ack_retry(self, job: Job, *, now: datetime, run_at: datetime, error: str) -> bool:
        """Return a claimed job to pending at *run_at* after a failed attempt."""
        values = {"status": JobStatus.PENDING.value, "run_at": run_at, "last_error": error}
        return self._acknowledge(job, values, now=now)

    def ack_failed(self, job: Job, *, now: datetime, error: str) -> bool:
        """Settle a claimed job as failed (out of attempts): the dead letter."""
        values = self._settle_values(JobStatus.FAILED, now)
        values["last_error"] = error
        return self._acknowledge(job, values, now=now)

    def ack_snooze(
        self,
        job: Job,
        *,
        now: datetime,
        run_at: datetime,
        note: str | None,
        still_owed: bool,
    ) -> bool:
        """Return a claimed job to pending at *run_at* without spending its attempt.

        ``still_owed`` keeps ``due_at`` (the job is late, e.g. its handler is not
        deployed yet); otherwise the job counts as due only from *run_at* (``NotYet``).
        """
        t = self.table
        values: dict[str, Any] = {
            "status": JobStatus.PENDING.value,
            "run_at": run_at,
            "attempts": t.c.attempts - 1,
            "last_error": note,
        }
        if not still_owed:
            values["due_at"] = run_at
        return self._acknowledge(job, values, now=now)

    def release(
        self, jobs: Sequence[Job], *, now: datetime, keep_run_at: bool = False
    ) -> int:
        """Hand claimed jobs back to pending, attempt not spent (shutdown, ``run_due``).

        They are due now, or at their old ``run_at`` with ``keep_run_at``.
        """
        t = self.table
        values: dict[str, Any] = {
            "status": JobStatus.PENDING.value,
            "attempts": t.c.attempts - 1,
            "claim_token": None,
            "lease_expires_at": None,
            "updated_at": now,
        }
        if not keep_run_at:
            values["run_at"] = now
        released = 0
        with self.begin() as conn:
            for job in jobs:
                released += conn.execute(self._guarded_ack(job).values(values)).rowcount
        return int(released)

    def extend_leases(
        self, jobs: Sequence[Job], *, now: datetime, lease_until: datetime
    ) -> int:
        """Heartbeat: push the lease of still-owned claims to *lease_until*."""
        if not jobs:
            return 0
        t = self.table
        owned = [and_(t.c.id == job.id, t.c.claim_token == job.claim_token) for job in jobs]
        stmt = (
            update(t)
            .where(t.c.status == JobStatus.RUNNING.value)
            .where(or_(*owned))
            .values(lease_expires_at=lease_until, updated_at=now)
        )
        with self.begin() as conn:
            return int(conn.execute(stmt).rowcount)

    def reclaim_lapsed(self, *, now: datetime) -> tuple[int, int]:
        """Return jobs whose lease lapsed to pending (or failed when out of attempts).

        The attempt the crashed worker started stays counted, so a job that kills its
        worker every time ends as a dead letter instead of looping forever.
        """
        t = self.table
        lapsed = (t.c.status == JobStatus.RUNNING.value) & (t.c.lease_expires_at < now)
        note = literal("lease lapsed: the worker running this job stopped renewing it")
        with self.begin_immediate() as conn:
            failed = conn.execute(
                update(t)
                .where(lapsed, t.c.attempts >= t.c.max_attempts)
                .values({**self._settle_values(JobStatus.FAILED, now), "last_error": note})
            ).rowcount
            returned = conn.execute(
                update(t)
                .where(lapsed)
                .values(
                    status=JobStatus.PENDING.value,
                    run_at=now,
                    claim_token=None,
                    lease_expires_at=None,
                    last_error=note,
                    updated_at=now,
                )
            ).rowcount
            if returned:
                self.notify(conn, "default")
        return int(returned), int(failed)

    def next_run_at(self, *, queues: Collection[str] | None = None) -> datetime | None:
        """When the earliest pending job is due (uses the partial run_at index).

        This is the SQLite worker's poll, so it must cost the same with a million
        future rows as with ten: one step into the partial index on pending run_at.
        """
        t = self.table
        # ORDER BY + LIMIT rather than min(): the value stays typed through UTCDateTime.
        stmt: Any = select(t.c.run_at).where(self._is_pending()).order_by(t.c.run_at).limit(1)
        if queues:
            stmt = stmt.where(t.c.queue.in_(list(queues)))
        if self.is_sqlite and self._sqlite_pending_index is not None:
            stmt = self._sqlite_next_pending(queues)
        try:
            with self.engine.connect() as conn:
                value: datetime | None = conn.execute(stmt).scalar()
        except OperationalError as error:
            if not self._lost_pending_index(error):
                raise
            return self.next_run_at(queues=queues)
        return value

    def prune(
        self,
        *,
        settled_before: datetime,
        failed_before: datetime,
        batch_size: int = 1000,
        max_batches: int | None = None,
    ) -> int:
        """Delete settled rows older than the retention, in batches; return how many.

        ``max_batches`` bounds one call, so a worker catching up on a huge backlog of
        history goes back to claiming jobs between rounds.
        """
        t = self.table
        old = (
            (t.c.status.in_([JobStatus.DONE.value, JobStatus.CANCELLED.value]))
            & (t.c.finished_at < settled_before)
        ) | ((t.c.status == JobStatus.FAILED.value) & (t.c.finished_at < failed_before))
        total = 0
        batches = 0
        while True:
            batch = select(t.c.id).where(old).limit(batch_size).scalar_subquery()
            with self.begin_immediate() as conn:
                deleted = int(conn.execute(delete(t).where(t.c.id.in_(batch))).rowcount)
            total += deleted
            batches += 1
            if deleted < batch_size or (max_batches is not None and batches >= max_batches):
                return total

    # -- helpers: soft delete and batching ------------------------------------------

    def hold_claim(self, conn: Connection, job: Job) -> bool:
        """Lock a claimed job's row in the caller's transaction; False if the claim is lost.

        An ``atomic=True`` handler calls this first, so its transaction takes the job
        row before the rows it works on, in the same order as an undo (cancel, then the
        app's row): the two can wait for each other but never deadlock. SQLite has one
        writer at a time and needs no row lock; there it is only the ownership check.
        """
        t = self.table
        stmt = (
            select(t.c.id)
            .where(
                t.c.id == job.id,
                t.c.status == JobStatus.RUNNING.value,
                t.c.claim_token == job.claim_token,
            )
            .with_for_update()
        )
        return conn.execute(stmt).first() is not None

    def batch_append(
        self,
        conn: Connection,
        *,
        name: str,
        key: str,
        item_json: str,
        now: datetime,
        max_items: int | None,
        debounce_until: datetime | None,
    ) -> BatchAppend | None:
        """Append one item to the pending batch job *name* holding *key*, in one statement.

        The guard (``status = 'pending'`` and, with *max_items*, "not full yet") makes
        the append and the worker's claim exclusive: an item lands in a batch before it
        is claimed, or the update touches nothing and the caller starts a new batch.
        *item_json* is the item as JSON text. ``debounce_until`` moves ``run_at`` there,
        but never past the batch's ``flush_by`` (its ``max_wait`` deadline); a batch
        that reaches *max_items* is made due at once and its key becomes
        ``<key>#full-<id>``. ``None`` when no such row accepts the item.
        """
        t = self.table
        if self.is_postgres:
            items = t.c.payload.op("->")(literal_column("'items'"))
            count_before = func.jsonb_array_length(items)
            # A one-element array concatenated to the list appends the item, even
            # when the item is itself an array.
            appended = func.jsonb_set(
                t.c.payload,
                literal_column("'{items}'"),
                items.op("||")(cast(literal("[" + item_json + "]", Text()), postgresql.JSONB)),
            )
            count_after: ColumnElement[Any] = literal_column(
                "jsonb_array_length(payload -> 'items')"
            )
            flush_by: ColumnElement[Any] = cast(
                t.c.payload.op("->>")(literal_column("'flush_by'")),
                postgresql.TIMESTAMP(timezone=True),
            )
            earliest: Any = func.least
        else:
            count_before = func.json_array_length(t.c.payload, literal_column("'$.items'"))
            appended = func.json_insert(
                t.c.payload, literal_column("'$.items[#]'"), func.json(literal(item_json, Text()))
            )
            count_after = literal_column("json_array_length(payload, '$.items')")
            # flush_by is ISO 8601 UTC; SQLite stores times as "YYYY-MM-DD HH:MM:SS.ffffff",
            # which compares correctly as text once the "T" and the offset are cut.
            iso = func.json_extract(t.c.payload, literal_column("'$.flush_by'"))
            flush_by = func.substr(iso, 1, 10).op("||")(" ").op("||")(func.substr(iso, 12, 15))
            earliest = func.min
        run_at: ColumnElement[Any] = t.c.run_at
        if debounce_until is not None:
            candidate = literal(debounce_until, UTCDateTime())
            run_at = earliest(candidate, func.coalesce(flush_by, candidate))
        conditions = [
            t.c.key == key,
            t.c.name == name,
            t.c.status == JobStatus.PENDING.value,
        ]
        values: dict[str, Any] = {"payload": appended, "updated_at": now}
        if max_items is not None:
            conditions.append(count_before < max_items)
            full = count_before + 1 >= max_items
            run_at = case((full, literal(now, UTCDateTime())), else_=run_at)
            # A full batch gives its key up (renamed after its id), so the next item
            # can open a new batch in the same slot while this one waits for a worker.
            values["key"] = case(
                (full, t.c.key + literal_column("'#full-'") + cast(t.c.id, String())),
                else_=t.c.key,
            )
        values["run_at"] = run_at
        stmt = (
            update(t)
            .where(*conditions)
            .values(values)
            .returning(t.c.id, t.c.run_at, t.c.queue, count_after)
        )
        row = conn.execute(stmt).first()
        if row is None:
            return None
        result = BatchAppend(job_id=int(row[0]), run_at=row[1], items=int(row[3]))
        if result.run_at <= now:
            # Full: wake a sleeping worker now rather than at its next poll.
            self.notify(conn, row[2])
        return result
    # -- the worker's side: one maintainer at a time, and LISTEN ------------------

    @contextmanager
    def maintenance_lock(self) -> Iterator[bool]:
        """Yield True in the one worker that may reclaim and prune right now.

        PostgreSQL: a transaction-scoped advisory lock, tried without waiting, held on
        a connection of its own for the duration of the block and released by its
        commit, or by the server if this worker dies. SQLite: always True; its
        writes are serialised anyway and reclaim/prune are guarded statements.
        """
        if not self.is_postgres:
            yield True
            return
        with self.engine.connect() as conn, conn.begin():
            locked = conn.execute(
                select(func.pg_try_advisory_xact_lock(self._maintenance_lock_key()))
            ).scalar()
            yield bool(locked)

    def _maintenance_lock_key(self) -> int:
        # One lock per jobs table, so two apps sharing a database do not exclude
        # each other. crc32 fits PostgreSQL's bigint key and is stable across runs.
        return zlib.crc32(f"flask_defer:{self.table.name}".encode())

    @property
    def can_listen(self) -> bool:
        """True when workers can LISTEN for NOTIFY (PostgreSQL through psycopg 3)."""
        return self.is_postgres and self.engine.dialect.driver == "psycopg"

    def open_listener(self) -> Any:
        """A dedicated psycopg connection, in autocommit, LISTENing on the channel.

        Taken from the engine (so it has the app's credentials and connect options)
        and detached from its pool: it lives as long as the worker and is closed by
        the caller. PostgreSQL only.
        """
        if not self.can_listen:
            raise RuntimeError("LISTEN needs PostgreSQL through psycopg 3")
        pooled = self.engine.raw_connection()
        conn: Any = pooled.driver_connection
        pooled.detach()
        try:
            conn.rollback()
            conn.autocommit = True
            conn.execute(f'LISTEN "{NOTIFY_CHANNEL}"')
        except BaseException:
            conn.close()
            raise
        return conn

    # -- pending rows through their partial index ---------------------------------

    def _is_pending(self) -> ColumnElement[bool]:
        # A literal, not a bound parameter: only a query whose WHERE visibly says
        # status = 'pending' may use the partial indexes on pending rows (SQLite always,
        # PostgreSQL in generic plans of prepared statements).
        return self.table.c.status == literal_column("'pending'")

    def _sqlite_next_pending(self, queues: Collection[str] | None) -> Any:
        sql, params = self._sqlite_pending_scan("run_at", queues)
        return (
            text(sql + " ORDER BY run_at LIMIT 1")
            .bindparams(*params)
            .columns(column("run_at", UTCDateTime()))
        )

    def _sqlite_due_ids(self, now: datetime, limit: int, queues: Collection[str] | None) -> Any:
        sql, params = self._sqlite_pending_scan("id", queues)
        return (
            text(sql + " AND run_at <= :now ORDER BY run_at, id LIMIT :limit")
            .bindparams(
                *params,
                bindparam("now", now, type_=UTCDateTime()),
                bindparam("limit", limit, type_=Integer()),
            )
            .columns(column("id", Integer()))
        )

    def _sqlite_pending_scan(
        self, columns: str, queues: Collection[str] | None
    ) -> tuple[str, list[BindParameter[Any]]]:
        # SQLite's planner, without ANALYZE statistics, prefers the (status,
        # finished_at) index for "status = 'pending'" and then sorts every pending
        # row: tens of milliseconds per poll with 50,000 pending rows, under the
        # write lock when claiming. INDEXED BY pins the partial run_at index, which
        # reads the first due rows and stops. (SQLAlchemy renders no SQLite hints,
        # hence text.)
        assert self._sqlite_pending_index is not None
        quote = self.engine.dialect.identifier_preparer.quote
        sql = (
            f"SELECT {columns} FROM {quote(self.table.name)} "
            f"INDEXED BY {quote(self._sqlite_pending_index)} WHERE status = 'pending'"
        )
        params: list[BindParameter[Any]] = []
        if queues:
            sql += " AND queue IN :queues"
            params.append(bindparam("queues", list(queues), expanding=True))
        return sql, params

    def _lost_pending_index(self, error: OperationalError) -> bool:
        """After "no such index" (a database migrated without it), stop naming it."""
        message = str(error.orig)
        if self._sqlite_pending_index is None or not (
            "no such index" in message or "no query solution" in message
        ):
            return False
        logger.warning(
            "index %s is missing from the database; falling back to an unindexed "
            "poll (create it with `flask defer install` or a migration)",
            self._sqlite_pending_index,
        )
        self._sqlite_pending_index = None
        return True

    # -- helpers ------------------------------------------------------------------

    def _acknowledge(
        self,
        job: Job,
        values: dict[str, Any],
        *,
        now: datetime,
        conn: Connection | None = None,
    ) -> bool:
        # Compare-and-set on the claim token: a worker whose lease lapsed (and whose
        # job was reclaimed and perhaps finished elsewhere) changes nothing.
        stmt = self._guarded_ack(job).values(
            {**values, "claim_token": None, "lease_expires_at": None, "updated_at": now}
        )
        if conn is not None:
            return conn.execute(stmt).rowcount == 1
        with self.begin() as own:
            return own.execute(stmt).rowcount == 1

    def _guarded_ack(self, job: Job) -> Any:
        t = self.table
        return update(t).where(
            t.c.id == job.id,
            t.c.status == JobStatus.RUNNING.value,
            t.c.claim_token == job.claim_token,
        )

    @staticmethod
    def _settle_values(status: JobStatus, now: datetime) -> dict[str, Any]:
        return {
            "status": status.value,
            "finished_at": now,
            "updated_at": now,
            "lease_expires_at": None,
            "claim_token": None,
        }

    def _identity(self, job_id: int | None, key: str | None) -> ColumnElement[bool]:
        t = self.table
        if job_id is not None:
            return t.c.id == job_id
        return t.c.key == key

    def _filter(self, where: JobFilter) -> ColumnElement[bool]:
        t = self.table
        conditions: list[ColumnElement[bool]] = []
        if where.statuses:
            conditions.append(t.c.status.in_([s.value for s in where.statuses]))
        if where.name is not None:
            conditions.append(t.c.name == where.name)
        if where.owner is not None:
            conditions.append(t.c.owner == where.owner)
        if where.queue is not None:
            conditions.append(t.c.queue == where.queue)
        if where.key_prefix is not None:
            conditions.append(self._key_startswith(where.key_prefix))
        return and_(literal(True), *conditions)

    def _key_startswith(self, prefix: str) -> ColumnElement[bool]:
        t = self.table
        # autoescape escapes % and _ in the bound prefix, so "a_b:" matches only itself.
        like = t.c.key.startswith(prefix, autoescape=True)
        if self.is_sqlite:
            # SQLite's LIKE ignores ASCII case; the exact substr comparison restores it.
            return like & (func.substr(t.c.key, 1, len(prefix)) == prefix)
        return like


# -- helpers: batching -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchAppend:
    """Where :meth:`JobStore.batch_append` put an item: the batch, its size and due time."""

    job_id: int
    run_at: datetime
    items: int
