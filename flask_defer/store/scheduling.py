"""Writes on behalf of callers: schedule, cancel, reschedule, retry, batch.

Each change of state is one guarded statement in the caller's transaction, so a
cancel that races the worker's claim either wins or cleanly loses.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    String,
    Text,
    case,
    cast,
    func,
    insert,
    literal,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from ..errors import JobExists
from ..jobs import Job, JobStatus
from ..schema import LIVE_STATUSES, UTCDateTime
from .history import HistoryStatements
from .records import (
    NOTIFY_CHANNEL,
    BatchAppend,
    HistoryEvent,
    JobFilter,
    NewJob,
)

#: A stand-in job, only to learn the column names an insert binds.
_PROBE = NewJob(name="", payload={}, run_at=datetime(2000, 1, 1, tzinfo=UTC), max_attempts=1)


class SchedulingStatements(HistoryStatements):
    """Writes on behalf of callers: schedule, cancel, reschedule, retry, batch."""

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
        notify = self.is_postgres and self.wants_notify(new.run_at, now)
        if new.key is None:
            job_id = self._insert_one(conn, values, notify=notify, actor=actor)
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
        self, conn: Connection, values: dict[str, Any], *, notify: bool, actor: str
    ) -> int:
        """The keyless insert: one prebuilt statement, values as parameters.

        Compiled once per store (the statement never changes), executed through the
        driver with each column type's own bind conversion; RETURNING only the id,
        since the caller's :class:`Job` is built from the values it already has. On
        PostgreSQL the NOTIFY and the ``scheduled`` history event ride in the same
        statement (data-modifying CTEs), so a job costs one round trip, not two or
        three; on SQLite the event is a second local statement.
        """
        with_history = self.is_postgres and self.history_table is not None
        sql, order, processors = self._prebuilt_insert(
            conn, notify=notify, history=with_history
        )
        params = tuple(
            value if process is None else process(value)
            for process, value in zip(processors, (values[name] for name in order), strict=True)
        )
        if with_history:
            params += (values["created_at"], actor, values["run_at"])
        if notify:
            params += (values["queue"],)
        job_id = int(conn.exec_driver_sql(sql, params).scalar_one())
        if not with_history:
            at, run_at = values["created_at"], values["run_at"]
            self.record_events(
                conn, [HistoryEvent(job_id, "scheduled", at, actor, 0, run_at=run_at)]
            )
        return job_id

    def _prebuilt_insert(
        self, conn: Connection, *, notify: bool, history: bool = False
    ) -> tuple[str, list[str], list[Any]]:
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
            # Named (pyformat) placeholders, turned positional so the tuple above fits.
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
        processors = [
            self.table.c[name].type.dialect_impl(dialect).bind_processor(dialect)
            for name in order
        ]
        built = (sql, order, processors)
        self._insert_sql[(notify, history)] = built
        return built

    @staticmethod
    def _inserted_job(job_id: int, values: dict[str, Any]) -> Job:
        """The :class:`Job` just written, from the values written (no read back).

        Built through :meth:`Job.from_row`, the one place that reads a stored row, so a
        ``label`` column holding the toast's state texts is split exactly as on a read.
        """
        return Job.from_row(
            {**values, "id": job_id, "status": JobStatus.PENDING.value}
        )

    def insert_many(
        self, conn: Connection, jobs: Sequence[NewJob], *, now: datetime, actor: str = "app"
    ) -> int:
        """Insert many keyless jobs in one statement batch (the bulk enqueue path).

        With history on, the INSERT returns the new ids (in the order of *jobs*) for
        their ``scheduled`` events, one more batched INSERT.
        """
        if not jobs:
            return 0
        rows = [self._row_values(job, now) for job in jobs]
        if self.history_table is not None:
            t = self.table
            ids = conn.execute(
                insert(t).returning(t.c.id, sort_by_parameter_order=True), rows
            ).scalars()
            self.record_events(
                conn,
                [
                    HistoryEvent(int(job_id), "scheduled", now, actor, 0, run_at=job.run_at)
                    for job_id, job in zip(ids, jobs, strict=True)
                ],
            )
        elif self.is_sqlite:
            self._sqlite_executemany(conn, rows)
        else:
            conn.execute(insert(self.table), rows)
        for queue in {job.queue for job in jobs if self.wants_notify(job.run_at, now)}:
            self.notify(conn, queue)
        return len(jobs)

    def _sqlite_executemany(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        """SQLite's bulk insert: SQLAlchemy's own compiled INSERT, handed tuples.

        On SQLite the insert itself is cheap, and SQLAlchemy's executemany spent most of
        a bulk enqueue building and converting one parameter dict per row. This sends the
        same compiled statement with the same per-column conversions (each column type's
        bind processor), as positional tuples; a test checks the stored bytes match.
        """
        names = list(rows[0])
        compiled = insert(self.table).compile(dialect=conn.dialect, column_keys=names)
        order = list(compiled.positiontup or ())
        processors = [
            self.table.c[name].type.dialect_impl(conn.dialect).bind_processor(conn.dialect)
            for name in order
        ]
        params = [
            tuple(
                value if process is None else process(value)
                for process, value in zip(processors, (row[name] for name in order), strict=True)
            )
            for row in rows
        ]
        conn.exec_driver_sql(compiled.string, params)

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

    def cancel(
        self,
        conn: Connection,
        *,
        now: datetime,
        job_id: int | None = None,
        key: str | None = None,
        owner: str | None = None,
        actor: str = "app",
        event: str = "cancelled",
    ) -> Job | None:
        """Cancel the pending job with this id or key; ``None`` if none was pending.

        ``owner`` narrows the guard so a user can only ever cancel their own job, even
        if they guess another id. *event* names it in the history: ``cancelled``, or
        ``undone`` for the owner's Undo.
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
        if row is None:
            return None
        self.record_events(conn, [HistoryEvent(row["id"], event, now, actor, row["attempts"])])
        return Job.from_row(row)

    def cancel_many(
        self, conn: Connection, where: JobFilter, *, now: datetime, actor: str = "app"
    ) -> tuple[int, int]:
        """Cancel every pending job matching *where*; return (cancelled, still running)."""
        t = self.table
        condition = self._filter(where)
        gone = conn.execute(
            update(t)
            .where(condition, t.c.status == JobStatus.PENDING.value)
            .values(self._settle_values(JobStatus.CANCELLED, now))
            .returning(t.c.id, t.c.attempts)
        ).all()
        self.record_events(
            conn,
            [HistoryEvent(int(i), "cancelled", now, actor, attempts) for i, attempts in gone],
        )
        cancelled = len(gone)
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
        actor: str = "app",
        event: str = "rescheduled",
    ) -> Job | None:
        """Move a pending job to *run_at*; ``None`` if no job with this id/key is pending.

        *event* names it in the history: ``rescheduled``, or ``run_now``.
        """
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
        if row is None:
            return None
        self.record_events(
            conn, [HistoryEvent(row["id"], event, now, actor, row["attempts"], run_at=run_at)]
        )
        # Moved earlier ("run now"), it must not wait for a worker's timed wake.
        self.notify(conn, row["queue"])
        return Job.from_row(row)

    def hold(
        self,
        conn: Connection,
        job_id: int,
        *,
        owner: str | None,
        undo_until: datetime,
        margin: timedelta,
        max_hold: timedelta,
        now: datetime,
    ) -> Job | None:
        """Push an open Undo window to *undo_until* (``run_at`` a *margin* after it).

        ``None`` when refused: not *owner*'s job (any owner's with None), not pending,
        its window already over at *now*, or already at least that late. A request past
        the cap — ``run_at`` at most *max_hold* after ``due_at``, the time the job was
        first due, which a hold (like a retry's backoff) never moves — is cut to the
        cap. Each write is one guarded statement; the cap is compared as ``due_at >=
        run_at - max_hold`` so no date arithmetic happens in SQL (SQLite stores text).
        The read between the two attempts only finds the cap; the guard decides.
        """
        moved = self._guarded_hold(conn, job_id, owner, undo_until, margin, max_hold, now)
        if moved is not None:
            return moved
        t = self.table
        current = conn.execute(select(t.c.due_at, t.c.undo_until).where(t.c.id == job_id)).first()
        if current is None or current.undo_until is None:
            return None
        cap = current.due_at + max_hold - margin
        if current.undo_until < cap < undo_until:
            return self._guarded_hold(conn, job_id, owner, cap, margin, max_hold, now)
        return None

    def _guarded_hold(
        self,
        conn: Connection,
        job_id: int,
        owner: str | None,
        undo_until: datetime,
        margin: timedelta,
        max_hold: timedelta,
        now: datetime,
    ) -> Job | None:
        t = self.table
        run_at = undo_until + margin
        stmt = (
            update(t)
            .where(
                t.c.id == job_id,
                t.c.status == JobStatus.PENDING.value,
                t.c.undo_until > now,
                t.c.undo_until < undo_until,
                t.c.due_at >= run_at - max_hold,
            )
            .values(undo_until=undo_until, run_at=run_at, updated_at=now)
            .returning(*t.c)
        )
        if owner is not None:
            stmt = stmt.where(t.c.owner == owner)
        row = conn.execute(stmt).mappings().first()
        return Job.from_row(row) if row is not None else None

    def retry_failed(
        self, conn: Connection, job_id: int, *, now: datetime, actor: str = "app"
    ) -> Job | None:
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
        if row is None:
            return None
        self.record_events(
            conn, [HistoryEvent(job_id, "retried_by_operator", now, actor, 0, run_at=now)]
        )
        self.notify(conn, row["queue"])
        return Job.from_row(row)

    # -- dashboard: bulk retry -------------------------------------------------------

    def retry_failed_many(
        self, conn: Connection, where: JobFilter, *, now: datetime, actor: str = "app"
    ) -> int:
        """Put every failed job matching *where* back to pending, due now; return how many.

        One guarded statement (``... AND status = 'failed'``), like the single retry:
        a row that is not failed at the moment of the update is left alone.
        """
        t = self.table
        retried = conn.execute(
            update(t)
            .where(self._filter(where), t.c.status == JobStatus.FAILED.value)
            .values(
                status=JobStatus.PENDING.value,
                attempts=0,
                run_at=now,
                due_at=now,
                finished_at=None,
                updated_at=now,
            )
            .returning(t.c.id, t.c.queue)
        ).all()
        self.record_events(
            conn,
            [
                HistoryEvent(int(job_id), "retried_by_operator", now, actor, 0, run_at=now)
                for job_id, _queue in retried
            ],
        )
        for queue in {queue for _id, queue in retried}:
            self.notify(conn, queue)
        return len(retried)

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
        ``<key>#full-<id>``. ``None`` when no such row accepts the item, which includes
        a batch already due at *now*.
        """
        # Long on purpose: one guarded UPDATE built for both dialects; splitting it would
        # hide which conditions the single statement checks together.
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
            # A batch that is due belongs to the worker: on PostgreSQL every append
            # locks the row until its transaction commits, and the claim's SKIP LOCKED
            # passes over a locked row, so a busy key's appenders would keep an
            # overdue batch from ever being claimed. Late items open the next batch.
            # (SQLite has no row locks: its claim waits for the write lock instead.)
        ]
        if self.is_postgres:
            conditions.append(t.c.run_at > now)
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

    def batch_retire_due(self, conn: Connection, *, name: str, key: str, now: datetime) -> bool:
        """Move a due, unclaimed batch out of its slot (key ``<key>#due-<id>``); True if one was.

        A batch that is due takes no more items (see :meth:`batch_append`), so the slot
        it holds is only in the way of the next batch. It keeps its run_at and is
        claimed like any due job; one write per due batch, by the item that needs
        the slot, instead of every later item locking it.
        """
        t = self.table
        stmt = (
            update(t)
            .where(
                t.c.key == key,
                t.c.name == name,
                t.c.status == JobStatus.PENDING.value,
                t.c.run_at <= now,
            )
            .values(key=t.c.key + literal_column("'#due-'") + cast(t.c.id, String()))
        )
        return bool(conn.execute(stmt).rowcount)

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
