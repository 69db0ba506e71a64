"""The worker's statements: claim, acknowledge, leases, reclaim, prune, LISTEN.

Acknowledgements are compare-and-set on the claim token, so a worker whose lease
lapsed can never overwrite the outcome of the worker that took the job over.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    and_,
    delete,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.exc import OperationalError

from ..jobs import Job, JobStatus
from .history import HistoryStatements
from .records import (
    NOTIFY_CHANNEL,
    HistoryEvent,
)


class ClaimStatements(HistoryStatements):
    """The worker's statements: claim, acknowledge, leases, reclaim, prune, LISTEN."""

    def claim(
        self,
        *,
        now: datetime,
        limit: int,
        token: str,
        lease_until: datetime,
        queues: Collection[str] | None = None,
        actor: str = "app",
    ) -> list[Job]:
        """Atomically move up to *limit* due pending jobs to running and return them.

        PostgreSQL: ``FOR UPDATE SKIP LOCKED`` lets many workers claim side by side
        without ever taking the same row. SQLite: one ``UPDATE ... RETURNING`` inside
        ``BEGIN IMMEDIATE``, serialised by the database's single write lock. Each
        claimed job's ``started`` event, by *actor*, is one INSERT in the same
        transaction.
        """
        # Long on purpose: one guarded statement per dialect, side by side so they stay alike.
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
        actor: str = "app",
    ) -> bool:
        """Mark a claimed job done; False if this claim no longer owns it.

        Pass *conn* to commit the mark together with the handler's own database work
        (``atomic=True`` handlers).
        """
        values = self._settle_values(JobStatus.DONE, now)
        values.update(last_error=None, result=result)
        event = HistoryEvent(job.id, "done", now, actor, job.attempts)
        return self._acknowledge(job, values, now=now, event=event, conn=conn)

    def ack_retry(
        self, job: Job, *, now: datetime, run_at: datetime, error: str, actor: str = "app"
    ) -> bool:
        """Return a claimed job to pending at *run_at* after a failed attempt."""
        values = {"status": JobStatus.PENDING.value, "run_at": run_at, "last_error": error}
        event = HistoryEvent(job.id, "retried", now, actor, job.attempts, error, run_at)
        return self._acknowledge(job, values, now=now, event=event)

    def ack_failed(self, job: Job, *, now: datetime, error: str, actor: str = "app") -> bool:
        """Settle a claimed job as failed (out of attempts): the dead letter."""
        values = self._settle_values(JobStatus.FAILED, now)
        values["last_error"] = error
        event = HistoryEvent(job.id, "failed", now, actor, job.attempts, error)
        return self._acknowledge(job, values, now=now, event=event)

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
        t = self.table
        values: dict[str, Any] = {
            "status": JobStatus.PENDING.value,
            "run_at": run_at,
            "attempts": t.c.attempts - 1,
            "last_error": note,
        }
        if not still_owed:
            values["due_at"] = run_at
        event = HistoryEvent(job.id, "snoozed", now, actor, job.attempts, note, run_at)
        return self._acknowledge(job, values, now=now, event=event)

    def release(self, jobs: Sequence[Job], *, now: datetime, keep_run_at: bool = False) -> int:
        """Hand claimed jobs back to pending, attempt not spent (shutdown, ``run_due``).

        They are due now, or at their old ``run_at`` with ``keep_run_at``. The claim
        is undone, attempt and all, so its ``started`` event goes too: the handler was
        never given the job.
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
        released: list[Job] = []
        with self.begin() as conn:
            for job in jobs:
                if conn.execute(self._guarded_ack(job).values(values)).rowcount == 1:
                    released.append(job)
            self._forget_started(conn, released)
        return len(released)

    def extend_leases(self, jobs: Sequence[Job], *, now: datetime, lease_until: datetime) -> int:
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

    def reclaim_lapsed(self, *, now: datetime, actor: str = "app") -> tuple[int, int]:
        """Return jobs whose lease lapsed to pending (or failed when out of attempts).

        The attempt the crashed worker started stays counted, so a job that kills its
        worker every time ends as a dead letter instead of looping forever. Each job
        gets a ``reclaimed`` event by *actor* naming the worker that lost it (the
        actor of its last ``started``), and ``failed`` too when it was out of attempts.
        """
        t = self.table
        lapsed = (t.c.status == JobStatus.RUNNING.value) & (t.c.lease_expires_at < now)
        note = "lease lapsed: the worker running this job stopped renewing it"
        with self.begin_immediate() as conn:
            failed = conn.execute(
                update(t)
                .where(lapsed, t.c.attempts >= t.c.max_attempts)
                .values({**self._settle_values(JobStatus.FAILED, now), "last_error": note})
                .returning(t.c.id, t.c.attempts)
            ).all()
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
                .returning(t.c.id, t.c.attempts)
            ).all()
            if returned:
                self.notify(conn, "default")
            if self.history_table is not None and (failed or returned):
                self._record_reclaimed(conn, now, actor, note, returned=returned, failed=failed)
        return len(returned), len(failed)

    def _record_reclaimed(
        self,
        conn: Connection,
        now: datetime,
        actor: str,
        note: str,
        *,
        returned: Sequence[Any],
        failed: Sequence[Any],
    ) -> None:
        lost_by = self._last_started_by(conn, [int(r[0]) for r in (*returned, *failed)])
        events: list[HistoryEvent] = []
        for job_id, attempts in (*returned, *failed):
            worker = lost_by.get(int(job_id), "an unknown worker")
            why = f"lease lapsed: {worker} stopped renewing it"
            events.append(HistoryEvent(int(job_id), "reclaimed", now, actor, attempts, why, now))
        events.extend(
            HistoryEvent(int(job_id), "failed", now, actor, attempts, note)
            for job_id, attempts in failed
        )
        self.record_events(conn, events)

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
                # The job's history goes in the same transaction as the job.
                gone = conn.execute(delete(t).where(t.c.id.in_(batch)).returning(t.c.id))
                ids = [int(job_id) for job_id in gone.scalars()]
                self._forget_history(conn, ids)
                deleted = len(ids)
            total += deleted
            batches += 1
            if deleted < batch_size or (max_batches is not None and batches >= max_batches):
                return total

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
