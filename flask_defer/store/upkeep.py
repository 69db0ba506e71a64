"""Leases, reclaim, prune and LISTEN: the statements that keep claimed rows honest.

A lapsed lease is handed back by one guarded statement under the maintenance lock,
so two workers never reclaim (or prune) the same rows twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    bindparam,
    delete,
    func,
    literal_column,
    select,
    tuple_,
    update,
)

from ..jobs import Job, JobStatus
from .dependencies import DependencyStatements
from .records import (
    HistoryEvent,
)
from .schema import UTCDateTime


class UpkeepStatements(DependencyStatements):
    """Leases, reclaim, prune and LISTEN: the statements that keep claimed rows honest."""

    def release(
        self,
        jobs: Sequence[Job],
        *,
        now: datetime,
        keep_run_at: bool = False,
    ) -> int:
        """Hand claimed jobs back to pending, attempt not spent (shutdown, ``run_due``).

        They are due now, or at their old ``run_at`` with ``keep_run_at``. The attempt
        their claim counted is given back, and their ``started`` event goes too: the
        handler was never given the job. They wake the workers of their queues (where
        the database can), as a new job would.
        """
        stmt = self._guarded_ack("release_keep_run_at" if keep_run_at else "release")
        released: list[Job] = []
        with self.begin() as conn:
            for job in jobs:
                params = {"job_id": job.id, "token": job.claim_token, "now": now}
                if conn.execute(stmt, params).rowcount == 1:
                    released.append(job)
            self._forget_started(conn, released)
            # Due (now, or at the run_at they were claimed at): another worker of their
            # queues may run them at once.
            for queue in sorted({job.queue for job in released}):
                self.notify(conn, queue)
        return len(released)

    def extend_leases(self, jobs: Sequence[Job], *, now: datetime, lease_until: datetime) -> int:
        """Heartbeat: push the lease of still-owned claims to *lease_until*."""
        if not jobs:
            return 0
        stmt = self._control_sql.get("extend_leases")
        if stmt is None:
            t = self.table
            # One prebuilt statement for any number of jobs: the (id, token) pairs are
            # one expanding bind, so only rows this worker's claims still own move.
            stmt = self._control_sql["extend_leases"] = (
                update(t)
                .where(
                    t.c.status == literal_column(f"'{JobStatus.RUNNING.value}'"),
                    tuple_(t.c.id, t.c.claim_token).in_(bindparam("owned", expanding=True)),
                )
                .values(
                    lease_expires_at=bindparam("lease_until", type_=UTCDateTime()),
                    updated_at=bindparam("now", type_=UTCDateTime()),
                )
            )
        params = {
            "owned": [(job.id, job.claim_token) for job in jobs],
            "lease_until": lease_until,
            "now": now,
        }
        with self.begin() as conn:
            return int(conn.execute(stmt, params).rowcount)

    def adopt_claim(self, token: str, *, now: datetime, lease_until: datetime) -> list[Job]:
        """The jobs a claim under *token* took, if they are still its own, leased anew to
        *lease_until*: for a claimer whose claim raised, so never answered.

        A claim can commit on the server and still raise in the claimer: the database
        went away between its commit and its reply. Those jobs are running, their
        attempt counted, and no handler has them. Adopting them by the token the
        claimer sent starts them after all, rather than a lease later with an attempt
        spent on nothing. The update is guarded like an acknowledgement: a job the
        reclaim already handed back, or that another claim took since, is not touched.
        A claim that never committed adopts nothing.
        """
        t = self.table
        stmt = (
            update(t)
            .where(t.c.status == JobStatus.RUNNING.value, t.c.claim_token == token)
            .values(lease_expires_at=lease_until, updated_at=now)
            .returning(*t.c)
        )
        with self.begin() as conn:
            rows = conn.execute(stmt).mappings().all()
        jobs = [Job.from_row(row) for row in rows]
        jobs.sort(key=lambda job: (job.priority, job.run_at, job.id))
        return jobs

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
            settled = conn.execute(
                update(t)
                .where(lapsed, t.c.attempts >= t.c.max_attempts)
                .values({**self._settle_values(JobStatus.FAILED, now), "last_error": note})
                .returning(t.c.id, t.c.attempts, t.c.dependents, t.c.queue)
            ).all()
            parents = [int(row[0]) for row in settled if row[2]]
            failed = [(row[0], row[1]) for row in settled]
            handed_back = conn.execute(
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
                .returning(t.c.id, t.c.attempts, t.c.queue)
            ).all()
            returned = [(row[0], row[1]) for row in handed_back]
            # Wake the workers of each job's own queue: the returned jobs are due now,
            # and a failed one may have freed its concurrency key's slot.
            for queue in sorted({row[-1] for row in (*handed_back, *settled)}):
                self.notify(conn, queue)
            if self.history_table is not None and (failed or returned):
                self._record_reclaimed(conn, now, actor, note, returned=returned, failed=failed)
            if parents:
                self.release_children(conn, parents, now=now, actor=actor)
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

    def expire_due(
        self,
        *,
        now: datetime,
        actor: str = "app",
        batch_size: int = 1000,
        on_expired: Callable[[list[Job]], None] | None = None,
    ) -> int:
        """Settle pending jobs whose ``expires_at`` is past as ``expired``; how many.

        *on_expired* is handed the settled jobs once their transaction committed (the
        ``job_expired`` signal).

        The claim never starts such a job, so this only makes the row say what it is
        (with an ``expired`` event by *actor*). Looks first through the partial index
        on expiring rows, so a sweep with nothing to do takes no write lock; settles at
        most *batch_size* per call. On PostgreSQL rows another transaction holds (a
        cancel not committed yet) are skipped and settled by a later sweep.
        """
        t = self.table
        expiring = [self._is_pending(), t.c.expires_at.is_not(None), t.c.expires_at <= now]
        with self.engine.connect() as conn:
            if conn.execute(select(t.c.id).where(*expiring).limit(1)).first() is None:
                return 0
        batch = self.driver.skip_locked(select(t.c.id).where(*expiring).limit(batch_size))
        note = "expired: not started by its expires_at"
        with self.begin_immediate() as conn:
            rows = conn.execute(
                update(t)
                .where(t.c.id.in_(batch.scalar_subquery()), self._is_pending())
                .values({**self._settle_values(JobStatus.EXPIRED, now), "last_error": note})
                .returning(*t.c)
            ).mappings().all()
            self.record_events(
                conn,
                [
                    HistoryEvent(int(row["id"]), "expired", now, actor, row["attempts"])
                    for row in rows
                ],
            )
            parents = [int(row["id"]) for row in rows if row["dependents"]]
            if parents:
                self.release_children(conn, parents, now=now, actor=actor)
        if on_expired is not None and rows:
            on_expired([Job.from_row(row) for row in rows])
        return len(rows)

    def next_expiry(self, *, now: datetime) -> datetime | None:
        """The earliest ``expires_at`` of a pending job still ahead of *now* (None: none):
        one step into the partial expiry index."""
        t = self.table
        stmt = select(func.min(t.c.expires_at)).where(
            self._is_pending(), t.c.expires_at.is_not(None), t.c.expires_at > now
        )
        with self.engine.connect() as conn:
            return conn.execute(stmt).scalar()

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
            (
                t.c.status.in_(
                    [JobStatus.DONE.value, JobStatus.CANCELLED.value, JobStatus.EXPIRED.value]
                )
            )
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
                self._forget_edges(conn, ids)
                deleted = len(ids)
            total += deleted
            batches += 1
            if deleted < batch_size or (max_batches is not None and batches >= max_batches):
                return total

    def maintenance_lock(self) -> AbstractContextManager[bool]:
        """Yield True in the one worker that may reclaim and prune right now.

        The driver's lock: on PostgreSQL a transaction-scoped advisory lock per jobs
        table, tried without waiting and released by the server if this worker dies;
        on SQLite always True (its writes are serialised anyway and reclaim and prune
        are guarded statements).
        """
        return self.driver.maintenance_lock()

    @property
    def can_listen(self) -> bool:
        """True when workers can LISTEN for NOTIFY (PostgreSQL through psycopg 3)."""
        return self.driver.can_listen

    def open_listener(self) -> Any:
        """A dedicated connection, in autocommit, LISTENing on the channel (the driver's;
        it lives as long as the worker and is closed by the caller)."""
        return self.driver.open_listener()

    def probe_listener(self, token: str) -> None:
        """Send the worker's LISTEN self-test notification, carrying *token*."""
        self.driver.probe_listener(token)
