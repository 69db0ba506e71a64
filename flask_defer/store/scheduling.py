"""Inserts on behalf of callers: one job and the NOTIFY that wakes a worker.

The insert is built once and run with parameters inside the caller's transaction, so
the job commits (or rolls back) with the caller's own change; many jobs at once are
one statement batch. The fast paths of both are the driver's (:mod:`.driver`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Dialect,
    insert,
    literal_column,
    select,
    update,
)

from ..errors import JobExists
from ..jobs import Job, JobStatus
from .dependencies import DependencyStatements
from .records import (
    HistoryEvent,
    NewJob,
)
from .schema import LIVE_STATUSES

#: A stand-in job, only to learn the column names an insert binds.
_PROBE = NewJob(name="", payload={}, run_at=datetime(2000, 1, 1, tzinfo=UTC), max_attempts=1)


class SchedulingStatements(DependencyStatements):
    """Inserts on behalf of callers: one job, and the NOTIFY that wakes a worker."""

    def insert(
        self, conn: Connection, new: NewJob, *, now: datetime, replace: bool, actor: str = "app"
    ) -> Job:
        """Insert one job in the caller's transaction and return it.

        With a key, ``ON CONFLICT DO NOTHING`` against the live-key index turns a taken
        key into :class:`JobExists` without an integrity error, which on PostgreSQL
        would abort the caller's whole transaction. ``replace`` first cancels the
        pending holder of the key (a running one cannot be replaced), recording it as
        ``replaced``; the new job's ``scheduled`` event is written with it.
        """
        t = self.table
        values = self.row_values(new, now)
        if new.concurrency_key is not None:
            self.keyed_scheduled()
        notify = self.driver.notifies and self.wants_notify(new.run_at, now)
        if new.key is not None and replace:
            replaced = conn.execute(
                update(t)
                .where(t.c.key == new.key, t.c.status == JobStatus.PENDING.value)
                .values(self._settle_values(JobStatus.CANCELLED, now))
                .returning(t.c.id, t.c.attempts, t.c.dependents)
            ).all()
            self.record_events(
                conn,
                [HistoryEvent(int(old_id), "replaced", now, actor, attempts)
                 for old_id, attempts, _ in replaced],
            )  # fmt: skip
            # A replaced job settles (cancelled): its children are released or cancelled.
            parents = [int(old_id) for old_id, _, has_children in replaced if has_children]
            if parents:
                self.release_children(conn, parents, now=now, actor=actor)
        # One prebuilt statement, values as parameters, on the driver's fastest path (its
        # history event and NOTIFY in the same round trip or the same local
        # transaction); the caller's Job is built from the values. A keyed insert is
        # ON CONFLICT DO NOTHING against the live-key index, compiled once as the
        # keyless one: SQLAlchemy's ON CONFLICT construct has no cache key, and
        # compiling it at every call was three fifths of a keyed schedule() (profiled).
        job_id = self.driver.insert_one(
            conn, values, notify=notify, actor=actor, payload_json=new.payload_json,
            keyed=new.key is not None,
        )  # fmt: skip
        if job_id is None:
            assert new.key is not None  # only a keyed insert finds its key taken
            holder = conn.execute(
                select(t.c.id).where(t.c.key == new.key, t.c.status.in_(LIVE_STATUSES))
            ).scalar()
            raise JobExists(new.key, holder)
        return self._inserted_job(job_id, values)

    def set_trace_context(
        self, conn: Connection, job_id: int, context: dict[str, str]
    ) -> None:
        """Store the scheduling span's trace context on the job just inserted in *conn*'s
        transaction (``flask_defer.tracing``). Apart from the insert on purpose: the
        insert every job takes binds no column for it, so apps without OpenTelemetry
        pay nothing for it."""
        t = self.table
        conn.execute(update(t).where(t.c.id == job_id).values(trace_context=context))

    def insert_many(
        self, conn: Connection, jobs: Sequence[NewJob], *, now: datetime, actor: str = "app"
    ) -> int:
        """Insert many keyless jobs in one statement batch (``schedule_many``); how many.

        The driver writes the rows and their ``scheduled`` events in the caller's
        transaction on its fastest bulk path (one statement over arrays, or one
        prepared INSERT executed per row); one NOTIFY per queue that needs it.
        """
        if not jobs:
            return 0
        self.driver.insert_many(conn, jobs, now=now, actor=actor)
        if self.driver.notifies:
            for queue in {job.queue for job in jobs if self.wants_notify(job.run_at, now)}:
                self.notify(conn, queue)
        return len(jobs)

    def job_insert(
        self, dialect: Dialect, *, keyed: bool = False
    ) -> tuple[str, list[str], list[tuple[int, Any]]]:
        """The INSERT of one job for the drivers' fast paths, built once.

        ``(sql, order, processors)``: the compiled ``INSERT ... RETURNING id`` with
        positional placeholders, the column names in the order it binds them (those of
        :meth:`row_values`), and ``(position, conversion)`` for the columns whose type
        converts a value (most do not), so a driver sends a plain tuple. With *keyed*,
        the insert of a job with a key: ``ON CONFLICT DO NOTHING`` against the live-key
        index, so a taken key returns no row.
        """
        cache_key = (dialect, keyed)
        cached = self._job_insert.get(cache_key)
        if cached is not None:
            return cached
        table = self.table
        names = list(self.row_values(_PROBE, _PROBE.run_at))
        stmt: Any = insert(table)
        if keyed:
            stmt = self.driver.insert_ignoring(table).on_conflict_do_nothing(
                index_elements=[table.c.key],
                # Literal values, not bound parameters: once psycopg prepares the
                # statement (from its 6th run on a connection), PostgreSQL cannot
                # match "status IN ($1, $2)" to the partial index and refuses it.
                index_where=table.c.status.in_(
                    [literal_column(f"'{status}'") for status in LIVE_STATUSES]
                ),
            )
        compiled = stmt.returning(table.c.id).compile(dialect=dialect, column_keys=names)
        sql = compiled.string
        order = list(compiled.positiontup or ()) if compiled.positional else names
        if not compiled.positional:
            # Named (pyformat) placeholders, turned positional so the tuple fits; the
            # INSERT names its columns in the table's order, which *names* follows.
            assert names == [c.name for c in table.c if c.name in names]
            for name in order:
                sql = sql.replace(f"%({name})s", "%s")
        processors = [
            (i, process)
            for i, name in enumerate(order)
            if (process := table.c[name].type.dialect_impl(dialect).bind_processor(dialect))
            is not None
        ]
        built = self._job_insert[cache_key] = (sql, order, processors)
        return built

    @staticmethod
    def _inserted_job(job_id: int, values: dict[str, Any]) -> Job:
        """The :class:`Job` just written, from the values written (no read back).

        Built by :meth:`Job.builder` as a claimed job is, from the row as written.
        """
        return _written_job(job_id, values)


#: Builds the Job of a row just inserted from ``_row_values``' values (in their order),
#: then its id and status.
_WRITTEN_JOB = Job.builder(
    [*SchedulingStatements.row_values(_PROBE, _PROBE.run_at), "id", "status"]
)


def _written_job(job_id: int, values: dict[str, Any]) -> Job:
    """The job of a row just inserted with *values* (a ``row_values`` dict)."""
    return _WRITTEN_JOB((*values.values(), job_id, JobStatus.PENDING.value))
