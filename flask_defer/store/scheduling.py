"""Inserts on behalf of callers: one job and the NOTIFY that wakes a worker.

The insert is built once and run with parameters inside the caller's transaction, so
the job commits (or rolls back) with the caller's own change. Many jobs at once are
:mod:`.bulk_inserts`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Connection,
    bindparam,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from ..errors import JobExists
from ..jobs import Job, JobStatus
from .history import HistoryStatements
from .records import (
    NOTIFY_CHANNEL,
    HistoryEvent,
    NewJob,
)
from .schema import LIVE_STATUSES
from .write_lock import begin_write

#: A stand-in job, only to learn the column names an insert binds.
_PROBE = NewJob(name="", payload={}, run_at=datetime(2000, 1, 1, tzinfo=UTC), max_attempts=1)


class SchedulingStatements(HistoryStatements):
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
        values = self._row_values(new, now)
        if new.concurrency_key is not None:
            self.keyed_scheduled()
        notify = self.is_postgres and self.wants_notify(new.run_at, now)
        if new.key is None:
            job_id = self._insert_one(
                conn, values, notify=notify, actor=actor, payload_json=new.payload_json
            )
            return self._inserted_job(job_id, values)
        events: list[HistoryEvent] = []
        if replace:
            replaced = conn.execute(
                update(t)
                .where(t.c.key == new.key, t.c.status == JobStatus.PENDING.value)
                .values(self._settle_values(JobStatus.CANCELLED, now))
                .returning(t.c.id, t.c.attempts)
            ).all()
            events.extend(
                HistoryEvent(int(old_id), "replaced", now, actor, attempts)
                for old_id, attempts in replaced
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
            .returning(t.c.id)
        )
        found = conn.execute(stmt).scalar()
        if found is None:
            holder = conn.execute(
                select(t.c.id).where(t.c.key == new.key, t.c.status.in_(LIVE_STATUSES))
            ).scalar()
            raise JobExists(new.key, holder)
        events.append(HistoryEvent(int(found), "scheduled", now, actor, 0, run_at=new.run_at))
        self.record_events(conn, events)
        if notify:
            self.notify(conn, new.queue)
        return self._inserted_job(int(found), values)

    def wants_notify(self, run_at: datetime, now: datetime) -> bool:
        """Whether a job due at *run_at* must wake the workers when it commits.

        A listening worker never sleeps longer than ``notify_horizon`` (its
        ``DEFER_MAX_SLEEP``) without looking at the earliest ``run_at`` again, so a job
        due later than that is found by that look in time and its NOTIFY would only
        cost the commit a lock on the notification queue and every worker a wake-up.
        """
        return run_at <= now + self.notify_horizon

    def _insert_one(
        self,
        conn: Connection,
        values: dict[str, Any],
        *,
        notify: bool,
        actor: str,
        payload_json: str | None = None,
    ) -> int:
        """The keyless insert: one prebuilt statement, values as parameters.

        Compiled once per store (the statement never changes), executed through the
        driver with each column type's own bind conversion; RETURNING only the id,
        since the caller's :class:`Job` is built from the values it already has. On
        PostgreSQL the NOTIFY and the ``scheduled`` history event ride in the same
        statement (data-modifying CTEs), so a job costs one round trip, not two or
        three; on SQLite the event is a second local statement. SQLite stores
        *payload_json* (the text validation made of the payload) as it is, as the
        JSON column would have encoded it.
        """
        with_history = self.is_postgres and self.history_table is not None
        sql, order, processors = self._prebuilt_insert(conn, notify=notify, history=with_history)
        row = [values[name] for name in order]
        as_is = order.index("payload") if payload_json is not None and self.is_sqlite else -1
        for i, process in processors:
            row[i] = payload_json if i == as_is else process(row[i])
        params = tuple(row)
        if with_history:
            params += (values["created_at"], actor, values["run_at"])
        if notify:
            params += (values["queue"],)
        if self.is_sqlite:
            # SQLite runs the INSERT in this process in microseconds; SQLAlchemy's
            # execute around it cost more (profiled). The driver's cursor, inside the
            # caller's transaction, sends the same compiled statement and conversions,
            # and then the job's ``scheduled`` event. The cursor bypasses SQLAlchemy's
            # statement events, where the app's writes take SQLite's write lock in turn,
            # so the transaction is opened that way here.
            begin_write(conn)
            dbapi = conn.connection.driver_connection
            assert dbapi is not None
            cursor = dbapi.cursor()
            try:
                job_id = int(cursor.execute(sql, params).fetchone()[0])
                if self.history_table is not None:
                    # Its times are the job's created_at and run_at, converted above.
                    at, run_at = row[order.index("created_at")], row[order.index("run_at")]
                    cursor.execute(self._sqlite_scheduled_sql(conn), (job_id, at, actor, run_at))
            finally:
                cursor.close()
            return job_id
        # PostgreSQL: the event rode in the statement (with_history), or there is no history.
        return int(conn.exec_driver_sql(sql, params).scalar_one())

    def _sqlite_scheduled_sql(self, conn: Connection) -> str:
        """SQLite: the INSERT of a new job's ``scheduled`` event, binding its job id,
        time, actor and run_at (in that order), the rest written into the text."""
        sql = self._insert_sql_text.get("sqlite-scheduled")
        if sql is None:
            assert self.history_table is not None
            h = self.history_table
            stmt = insert(h).values(
                job_id=bindparam("b_job_id"),
                event=literal_column("'scheduled'"),
                at=bindparam("b_at"),
                actor=bindparam("b_actor"),
                attempt=literal_column("0"),
                run_at=bindparam("b_run_at"),
            )
            compiled = stmt.compile(dialect=conn.dialect)
            assert list(compiled.positiontup or ()) == ["b_job_id", "b_at", "b_actor", "b_run_at"]
            sql = self._insert_sql_text["sqlite-scheduled"] = compiled.string
        return sql

    def _prebuilt_insert(
        self, conn: Connection, *, notify: bool, history: bool = False
    ) -> tuple[str, list[str], list[tuple[int, Any]]]:
        cached = self._insert_sql.get((notify, history))
        if cached is not None:
            return cached
        dialect = conn.dialect
        names = list(self._row_values(_PROBE, _PROBE.run_at))
        compiled = (
            insert(self.table)
            .returning(self.table.c.id)
            .compile(dialect=dialect, column_keys=names)
        )
        positional = compiled.positional
        order = list(compiled.positiontup or ()) if positional else names
        sql = compiled.string
        if not positional:
            # Named (pyformat) placeholders, turned positional so the tuple above fits;
            # the INSERT names its columns in the table's order, which *names* follows.
            assert names == [c.name for c in self.table.c if c.name in names]
            for name in order:
                sql = sql.replace(f"%({name})s", "%s")
        placeholder = "?" if dialect.paramstyle == "qmark" else "%s"
        if notify or history:
            ctes = [f"inserted AS ({sql})"]
            if history:
                assert self.history_table is not None
                quoted = dialect.identifier_preparer.format_table(self.history_table)
                ctes.append(
                    f"recorded AS (INSERT INTO {quoted} (job_id, event, at, actor, attempt,"
                    f" run_at) SELECT inserted.id, 'scheduled', {placeholder}, {placeholder},"
                    f" 0, {placeholder} FROM inserted)"
                )
            notified = f", pg_notify('{NOTIFY_CHANNEL}', {placeholder})" if notify else ""
            sql = f"WITH {', '.join(ctes)} SELECT inserted.id{notified} FROM inserted"
        # Only the columns with a conversion, by position (most columns have none).
        processors = [
            (i, process)
            for i, name in enumerate(order)
            if (process := self.table.c[name].type.dialect_impl(dialect).bind_processor(dialect))
            is not None
        ]
        built = (sql, order, processors)
        self._insert_sql[(notify, history)] = built
        return built

    @staticmethod
    def _inserted_job(job_id: int, values: dict[str, Any]) -> Job:
        """The :class:`Job` just written, from the values written (no read back).

        Built by :meth:`Job.builder` as a claimed job is, from the row as written.
        """
        return _written_job(job_id, values)

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
            "waiting_label": new.waiting_label,
            "done_label": new.done_label,
            "failed_label": new.failed_label,
            "undone_label": new.undone_label,
            "undo_until": new.undo_until,
            "created_at": now,
            "updated_at": now,
            # In the table's column order, like the rest: the prebuilt insert binds
            # its named placeholders in this order (see _prebuilt_insert).
            "priority": new.priority,
            "concurrency_key": new.concurrency_key,
            "concurrency_limit": new.concurrency_limit,
            "expires_at": new.expires_at,
        }


#: Builds the Job of a row just inserted from ``_row_values``' values (in their order),
#: then its id and status.
_WRITTEN_JOB = Job.builder(
    [*SchedulingStatements._row_values(_PROBE, _PROBE.run_at), "id", "status"]
)


def _written_job(job_id: int, values: dict[str, Any]) -> Job:
    """The job of a row just inserted with *values* (a ``_row_values`` dict)."""
    return _WRITTEN_JOB((*values.values(), job_id, JobStatus.PENDING.value))
