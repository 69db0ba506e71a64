"""Control writes on behalf of callers: cancel, reschedule, hold, retry.

Each is one guarded statement in the caller's transaction, so a cancel that races the
worker's claim either wins or cleanly loses.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    bindparam,
    case,
    func,
    insert,
    literal_column,
    select,
    update,
)

from ..jobs import Job, JobStatus
from .dependencies import DependencyStatements
from .records import (
    HistoryEvent,
    JobFilter,
    NewJob,
)
from .schema import UTCDateTime

#: A stand-in job, only to learn the column names an insert binds.
_PROBE = NewJob(name="", payload={}, run_at=datetime(2000, 1, 1, tzinfo=UTC), max_attempts=1)


class ControlStatements(DependencyStatements):
    """Control writes on behalf of callers: cancel, reschedule, hold, retry."""

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
        by = "id" if job_id is not None else "key"
        # Where a statement is a round trip (PostgreSQL) the history event rides in the
        # same statement (one round trip less for every Undo); elsewhere, apart.
        with_event = self.driver.events_in_statement and self.history_table is not None
        name = f"cancel_by_{by}" + ("_owned" if owner is not None else "")
        stmt = self._control_sql.get(name)
        if stmt is None:
            stmt = self._control_sql[name] = self._cancel_statement(
                by, owned=owner is not None, with_event=with_event
            )
        params = {"job_id": job_id, "b_key": key, "b_owner": owner, "now": now}
        if with_event:
            params.update(b_event=event, b_actor=actor)
        result = conn.execute(stmt, params)
        # The job is built by a builder made once per statement (Job.builder), not by
        # from_row over a mapping: the Undo holds SQLite's write lock meanwhile, and
        # from_row took 18 µs of it (profiled).
        build = self._control_sql.get(name + ":job")
        if build is None:
            build = self._control_sql[name + ":job"] = Job.builder(list(result.keys()))
        row = result.first()
        if row is None:
            return None
        job = build(row)
        if not with_event:
            self.record_events(conn, [HistoryEvent(job.id, event, now, actor, job.attempts)])
        if row.dependents:
            # Its "done" children are cancelled with it, in this transaction.
            self.release_children(conn, [job.id], now=now, actor=actor)
        return job

    def _cancel_statement(self, by: str, *, owned: bool, with_event: bool) -> Any:
        """The guarded cancel (the Undo's statement), prebuilt per identity and owner
        guard; binds ``job_id`` or ``b_key``, ``b_owner``, ``now`` (a bind may not share
        a column's name in an UPDATE). *with_event*: the UPDATE is a CTE and an INSERT
        of its history event (``b_event`` by ``b_actor``) rides along in the same
        statement (PostgreSQL)."""
        t = self.table
        now = bindparam("now", type_=UTCDateTime())
        if by == "id":
            identity = t.c.id == bindparam("job_id", type_=t.c.id.type)
        else:
            identity = t.c.key == bindparam("b_key", type_=t.c.key.type)
        conditions = [identity, t.c.status == literal_column(f"'{JobStatus.PENDING.value}'")]
        if owned:
            conditions.append(t.c.owner == bindparam("b_owner", type_=t.c.owner.type))
        cancel = (
            update(t)
            .where(*conditions)
            .values(
                status=literal_column(f"'{JobStatus.CANCELLED.value}'"),
                finished_at=now,
                updated_at=now,
                lease_expires_at=None,
                claim_token=None,
            )
            .returning(*t.c)
        )
        if not with_event:
            return cancel
        assert self.history_table is not None
        cancelled = cancel.cte("cancelled")
        history = self.history_table
        event = bindparam("b_event", type_=history.c.event.type)
        actor = bindparam("b_actor", type_=history.c.actor.type)
        recorded = insert(history).from_select(
            ["job_id", "event", "at", "actor", "attempt"],
            select(cancelled.c.id, event, now, actor, cancelled.c.attempts),
        )
        return select(cancelled).add_cte(recorded.cte("recorded"))

    def request_abort(
        self, conn: Connection, job_id: int, *, now: datetime, actor: str = "app"
    ) -> bool:
        """Ask the worker running *job_id* to stop it; True if this call asked.

        One guarded statement (``... AND status = 'running' AND abort_requested_by IS
        NULL``): False when the job is not running (any more), or an abort was already
        asked for. Writes an ``abort_requested`` event by *actor*.
        """
        t = self.table
        row = conn.execute(
            update(t)
            .where(
                t.c.id == job_id,
                t.c.status == JobStatus.RUNNING.value,
                t.c.abort_requested_by.is_(None),
            )
            .values(abort_requested_by=actor, updated_at=now)
            .returning(t.c.attempts)
        ).first()
        if row is None:
            return False
        self.record_events(conn, [HistoryEvent(job_id, "abort_requested", now, actor, row[0])])
        return True

    def cancel_many_jobs(
        self, conn: Connection, where: JobFilter, *, now: datetime, actor: str = "app"
    ) -> tuple[list[Job], int]:
        """Cancel every pending job matching *where*; return the cancelled jobs as they
        now are (for the ``on_undo`` hooks and the ``job_cancelled`` signals) and how
        many matching jobs are still running."""
        t = self.table
        condition = self._filter(where)
        rows = conn.execute(
            update(t)
            .where(condition, t.c.status == JobStatus.PENDING.value)
            .values(self._settle_values(JobStatus.CANCELLED, now))
            .returning(*t.c)
        ).mappings().all()
        gone = [Job.from_row(row) for row in rows]
        self.record_events(
            conn, [HistoryEvent(job.id, "cancelled", now, actor, job.attempts) for job in gone]
        )
        parents = [int(row["id"]) for row in rows if row["dependents"]]
        if parents:
            self.release_children(conn, parents, now=now, actor=actor)
        in_flight = conn.execute(
            select(func.count())
            .select_from(t)
            .where(condition, t.c.status == JobStatus.RUNNING.value)
        ).scalar_one()
        return gone, int(in_flight)

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
        undo_until_at_most: datetime | None = None,
    ) -> Job | None:
        """Move a pending job to *run_at*; ``None`` if no job with this id/key is pending.

        *event* names it in the history: ``rescheduled``, or ``run_now``. An Undo
        window open past *undo_until_at_most* closes then (a job moved earlier must not
        offer Undo once a worker may claim it); a later move leaves it as it was.
        """
        t = self.table
        values: dict[str, Any] = {"run_at": run_at, "due_at": run_at, "updated_at": now}
        if undo_until_at_most is not None:
            values["undo_until"] = case(
                (t.c.undo_until > undo_until_at_most, undo_until_at_most),
                else_=t.c.undo_until,
            )
        row = (
            conn.execute(
                update(t)
                .where(self._identity(job_id, key), t.c.status == JobStatus.PENDING.value)
                .values(values)
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
        actor: str = "app",
    ) -> Job | None:
        """Push an open Undo window to *undo_until* (``run_at`` a *margin* after it).

        ``None`` when refused: not *owner*'s job (any owner's with None), not pending,
        its window already over at *now*, or already at least that late. A request past
        the cap — ``run_at`` at most *max_hold* after ``due_at``, the time the job was
        first due, which a hold (like a retry's backoff) never moves — is cut to the
        cap. Each write is one guarded statement; the cap is compared as ``due_at >=
        run_at - max_hold`` so no date arithmetic happens in SQL (SQLite stores text).
        The read between the two attempts only finds the cap; the guard decides.
        A move is in the history as ``rescheduled`` by *actor*, with the new ``run_at``.
        """
        moved = self._guarded_hold(conn, job_id, owner, undo_until, margin, max_hold, now)
        if moved is None:
            t = self.table
            current = conn.execute(
                select(t.c.due_at, t.c.undo_until).where(t.c.id == job_id)
            ).first()
            if current is None or current.undo_until is None:
                return None
            cap = current.due_at + max_hold - margin
            if not current.undo_until < cap < undo_until:
                return None
            moved = self._guarded_hold(conn, job_id, owner, cap, margin, max_hold, now)
        if moved is not None:
            event = HistoryEvent(
                moved.id, "rescheduled", now, actor, moved.attempts, run_at=moved.run_at
            )
            self.record_events(conn, [event])
        return moved

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
        """Put a failed job back to pending, due now, with its attempts reset and no
        abort request left from an earlier run."""
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
                    # A fresh start: an abort asked of an earlier run must not stop it.
                    abort_requested_by=None,
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
                abort_requested_by=None,  # as the single retry
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
