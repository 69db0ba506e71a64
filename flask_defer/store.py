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

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from operator import itemgetter
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Integer,
    String,
    Table,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    type_coerce,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.elements import ClauseElement

from .errors import JobExists
from .jobs import Job, JobStatus
from .schema import LIVE_STATUSES, UTCDateTime

#: PostgreSQL channel a scheduling transaction notifies; workers LISTEN on it.
NOTIFY_CHANNEL = "flask_defer"

# Read once: an enum member's ``.value`` is a descriptor call, and the bulk path makes
# one per row.
_PENDING = JobStatus.PENDING.value


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
    """Figures the health report is built from, read in one pass over live rows."""

    by_status: dict[str, int]
    scheduled: int
    owed: int
    oldest_owed_due_at: datetime | None
    lapsed_leases: int


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
        #: Hot-path statements built once per shape (see "prepared statements" below).
        self._prepared: dict[tuple[Any, ...], Any] = {}

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
        params = {f"new_{name}": value for name, value in values.items()}
        if new.key is None:
            stmt = self._insert_statement(tuple(values), keyed=False)
            row = conn.execute(stmt, params).mappings().one()
        else:
            if replace:
                conn.execute(
                    update(t)
                    .where(t.c.key == new.key, t.c.status == JobStatus.PENDING.value)
                    .values(self._settle_values(JobStatus.CANCELLED, now))
                )
            stmt = self._insert_statement(tuple(values), keyed=True)
            found = conn.execute(stmt, params).mappings().first()
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
        rows = [self._row_values(job, now) for job in jobs]
        if self.is_sqlite:
            sql, pick, converters = self._sqlite_insert_many(conn, tuple(rows[0]))
            params = []
            for row in rows:
                values = list(pick(row))
                for index, convert in converters:
                    values[index] = convert(values[index])
                params.append(tuple(values))
            conn.exec_driver_sql(sql, params)
        else:
            conn.execute(insert(self.table), rows)
        for queue in {job.queue for job in jobs}:
            self.notify(conn, queue)
        return len(jobs)

    def notify(self, conn: Connection, queue: str) -> None:
        """Wake PostgreSQL workers when the caller's transaction commits (no-op on SQLite)."""
        if self.is_postgres:
            params = {"notify_channel": NOTIFY_CHANNEL, "notify_queue": queue}
            conn.execute(self._notify_statement(), params)

    @staticmethod
    def _row_values(new: NewJob, now: datetime) -> dict[str, Any]:
        return {
            "name": new.name,
            "queue": new.queue,
            "key": new.key,
            "payload": new.payload,
            "status": _PENDING,
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

    def status_counts(self, conn: Connection, *, now: datetime) -> StatusCounts:
        """Counts by status, and the live backlog split into scheduled and owed."""
        t = self.table
        by_status = {
            status: int(n)
            for status, n in conn.execute(
                select(t.c.status, func.count()).group_by(t.c.status)
            )
        }
        pending = t.c.status == JobStatus.PENDING.value
        running = t.c.status == JobStatus.RUNNING.value
        owed_cond = (pending & (t.c.run_at <= now)) | running
        row = conn.execute(
            select(
                func.count().filter(pending & (t.c.run_at > now)),
                func.count().filter(owed_cond),
                # type_coerce: SQLite hands aggregates back as text; this parses them.
                type_coerce(func.min(t.c.due_at).filter(owed_cond), UTCDateTime()),
                func.count().filter(running & (t.c.lease_expires_at < now)),
            ).where(t.c.status.in_(LIVE_STATUSES))
        ).one()
        oldest = row[2]
        return StatusCounts(
            by_status=by_status,
            scheduled=int(row[0]),
            owed=int(row[1]),
            oldest_owed_due_at=oldest,
            lapsed_leases=int(row[3]),
        )

    def count_unknown(self, conn: Connection, known_names: Collection[str]) -> int:
        """Pending jobs whose name has no handler among *known_names*."""
        t = self.table
        stmt = (
            select(func.count())
            .select_from(t)
            .where(t.c.status == JobStatus.PENDING.value, t.c.name.not_in(list(known_names)))
        )
        return int(conn.execute(stmt).scalar_one())

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
        stmt = self._claim_statement(with_queues=bool(queues))
        params: dict[str, Any] = {
            "claim_now": now,
            "claim_limit": limit,
            "claim_token": token,
            "claim_lease_until": lease_until,
            "claim_updated_at": now,
        }
        if queues:
            params["claim_queues"] = list(queues)
        with self.begin_immediate() as conn:
            rows = conn.execute(stmt, params).mappings().all()
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
        """When the earliest pending job is due (uses the partial run_at index)."""
        t = self.table
        # ORDER BY + LIMIT rather than min(): the value stays typed through UTCDateTime.
        stmt = (
            select(t.c.run_at)
            .where(t.c.status == JobStatus.PENDING.value)
            .order_by(t.c.run_at)
            .limit(1)
        )
        if queues:
            stmt = stmt.where(t.c.queue.in_(list(queues)))
        with self.engine.connect() as conn:
            value = conn.execute(stmt).scalar()
        return value

    def prune(
        self,
        *,
        settled_before: datetime,
        failed_before: datetime,
        batch_size: int = 1000,
    ) -> int:
        """Delete settled rows older than the retention, in batches; return how many."""
        t = self.table
        old = (
            (t.c.status.in_([JobStatus.DONE.value, JobStatus.CANCELLED.value]))
            & (t.c.finished_at < settled_before)
        ) | ((t.c.status == JobStatus.FAILED.value) & (t.c.finished_at < failed_before))
        total = 0
        while True:
            batch = select(t.c.id).where(old).limit(batch_size).scalar_subquery()
            with self.begin_immediate() as conn:
                deleted = int(conn.execute(delete(t).where(t.c.id.in_(batch))).rowcount)
            total += deleted
            if deleted < batch_size:
                return total

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
        values = {**values, "claim_token": None, "lease_expires_at": None, "updated_at": now}
        stmt, params = self._ack_statement(job, values)
        if conn is not None:
            return conn.execute(stmt, params).rowcount == 1
        with self.begin() as own:
            return own.execute(stmt, params).rowcount == 1

    def _guarded_ack(self, job: Job) -> Any:
        t = self.table
        return update(t).where(
            t.c.id == job.id,
            t.c.status == JobStatus.RUNNING.value,
            t.c.claim_token == job.claim_token,
        )

    # -- prepared statements (hot paths) --------------------------------------------
    #
    # The claim and the acknowledgements run for every job. Building a Core statement
    # and its cache key each time costs more than the database round trip on a local
    # server, so these are built once per shape, with bind parameters, and reused:
    # the SQL sent is exactly what building them per call produced (the tests compare
    # the compiled forms).

    def _claim_statement(self, *, with_queues: bool) -> Any:
        """``UPDATE ... RETURNING`` moving due pending jobs to running (see :meth:`claim`)."""
        key = ("claim", with_queues)
        stmt = self._prepared.get(key)
        if stmt is not None:
            return stmt
        t = self.table
        now = bindparam("claim_now", type_=t.c.run_at.type)
        due = (
            select(t.c.id)
            .where(t.c.status == JobStatus.PENDING.value, t.c.run_at <= now)
            .order_by(t.c.run_at, t.c.id)
            .limit(bindparam("claim_limit", type_=Integer()))
            .with_for_update(skip_locked=True)
        )
        if with_queues:
            due = due.where(t.c.queue.in_(bindparam("claim_queues", expanding=True)))
        values = {
            "status": JobStatus.RUNNING.value,
            "attempts": t.c.attempts + 1,
            "claim_token": bindparam("claim_token", type_=t.c.claim_token.type),
            "lease_expires_at": bindparam(
                "claim_lease_until", type_=t.c.lease_expires_at.type
            ),
            "updated_at": bindparam("claim_updated_at", type_=t.c.updated_at.type),
        }
        if self.is_postgres:
            # A materialised CTE runs the locking SELECT exactly once. As an IN (...)
            # subquery PostgreSQL may re-run it per row, claiming more than *limit*.
            due_cte = due.cte("due").prefix_with("MATERIALIZED")
            stmt = update(t).where(t.c.id == due_cte.c.id).values(values).returning(*t.c)
        else:
            stmt = (
                update(t)
                .where(t.c.id.in_(due.scalar_subquery()), t.c.status == JobStatus.PENDING.value)
                .values(values)
                .returning(*t.c)
            )
        self._prepared[key] = stmt
        return stmt

    def _insert_statement(self, names: tuple[str, ...], *, keyed: bool) -> Any:
        """``INSERT ... RETURNING`` of one job; keyed: ``ON CONFLICT DO NOTHING`` on the key."""
        key = ("insert", keyed, *names)
        stmt = self._prepared.get(key)
        if stmt is not None:
            return stmt
        t = self.table
        values = {name: bindparam(f"new_{name}", type_=t.c[name].type) for name in names}
        if not keyed:
            stmt = insert(t).values(values).returning(*t.c)
        else:
            dialect_insert = postgresql.insert if self.is_postgres else sqlite.insert
            stmt = (
                dialect_insert(t)
                .values(values)
                .on_conflict_do_nothing(
                    index_elements=[t.c.key], index_where=t.c.status.in_(LIVE_STATUSES)
                )
                .returning(*t.c)
            )
        self._prepared[key] = stmt
        return stmt

    def _sqlite_insert_many(
        self, conn: Connection, names: tuple[str, ...]
    ) -> tuple[str, Callable[[dict[str, Any]], tuple[Any, ...]], list[tuple[int, Any]]]:
        """The SQLite bulk insert compiled once: its SQL, how to pick a row's values in
        parameter order, and the conversion of the positions whose type has one.

        SQLAlchemy's executemany builds and converts a parameter dict per row; on
        SQLite, where the insert itself is cheap, that was most of a bulk enqueue. This
        is the same compiled ``INSERT`` with the same conversions (each column type's
        own bind processor), handed to the driver as tuples.
        """
        key = ("sqlite_insert_many", *names)
        prepared = self._prepared.get(key)
        if prepared is None:
            t = self.table
            compiled = insert(t).compile(dialect=conn.dialect, column_keys=list(names))
            order = list(compiled.positiontup or ())
            converters = []
            for index, bind_name in enumerate(order):
                column_type = t.c[bind_name].type.dialect_impl(conn.dialect)
                process = column_type.bind_processor(conn.dialect)
                if process is not None:
                    converters.append((index, process))
            pick = itemgetter(*order) if len(order) > 1 else (lambda row: (row[order[0]],))
            prepared = (compiled.string, pick, converters)
            self._prepared[key] = prepared
        return prepared  # type: ignore[no-any-return,unused-ignore]

    def _notify_statement(self) -> Any:
        """``SELECT pg_notify(:channel, :queue)``."""
        stmt = self._prepared.get(("notify",))
        if stmt is None:
            stmt = select(
                func.pg_notify(
                    bindparam("notify_channel", type_=String()),
                    bindparam("notify_queue", type_=String()),
                )
            )
            self._prepared[("notify",)] = stmt
        return stmt

    def _ack_statement(self, job: Job, values: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """The guarded acknowledgement of *job* setting *values*, and its parameters.

        Values that are SQL expressions (``attempts - 1``), or a job without a claim
        token (``claim_token IS NULL`` rather than ``= :token``), take the statement
        built per call; everything else reuses one statement per set of columns.
        """
        if job.claim_token is None or any(isinstance(v, ClauseElement) for v in values.values()):
            return self._guarded_ack(job).values(values), {}
        names = tuple(sorted(values))
        key = ("ack", *names)
        stmt = self._prepared.get(key)
        if stmt is None:
            t = self.table
            sets = {name: bindparam(f"ack_set_{name}", type_=t.c[name].type) for name in names}
            stmt = (
                update(t)
                .where(
                    t.c.id == bindparam("ack_id", type_=t.c.id.type),
                    t.c.status == JobStatus.RUNNING.value,
                    t.c.claim_token == bindparam("ack_token", type_=t.c.claim_token.type),
                )
                .values(sets)
            )
            self._prepared[key] = stmt
        params = {f"ack_set_{name}": value for name, value in values.items()}
        params.update(ack_id=job.id, ack_token=job.claim_token)
        return stmt, params

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
