"""Reads: single jobs, filtered lists, the health figures and an owner's toasts."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy import (
    Connection,
    case,
    func,
    select,
    type_coerce,
)

from ..jobs import Job, JobStatus
from ..schema import LIVE_STATUSES, UTCDateTime
from .base import StoreBase
from .records import (
    UNKNOWN_HANDLER_NOTE,
    JobFilter,
    StatusCounts,
)


class ReadStatements(StoreBase):
    """Reads: single jobs, filtered lists, the health figures and an owner's toasts."""

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

    def find(self, conn: Connection, where: JobFilter, *, limit: int, offset: int = 0) -> list[Job]:
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

    def undoable_for(self, conn: Connection, owner: str, *, now: datetime, limit: int) -> list[Job]:
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

    def toast_jobs_for(
        self, conn: Connection, owner: str, *, since: datetime, limit: int
    ) -> list[Job]:
        """*owner*'s live jobs with an Undo window that closed after *since* or is open.

        Open ones (pending, window not over) and waiting ones (window over, not settled
        yet: pending until the worker claims it, or running), newest window first: the
        toasts a page renders. Uses the partial owner index like :meth:`undoable_for`.
        """
        t = self.table
        stmt = (
            select(t)
            .where(
                t.c.owner == owner,
                t.c.status.in_(LIVE_STATUSES),
                t.c.undo_until > since,
            )
            .order_by(t.c.undo_until.desc(), t.c.id.desc())
            .limit(limit)
        )
        return [Job.from_row(row) for row in conn.execute(stmt).mappings()]

    def owned(self, conn: Connection, owner: str, ids: Collection[int]) -> list[Job]:
        """The jobs among *ids* that belong to *owner* (others' ids are left out, unsaid).

        What a page that watches its toasts asks for while one of them is waiting: a
        primary-key lookup of a handful of rows.
        """
        if not ids:
            return []
        t = self.table
        stmt = select(t).where(t.c.id.in_(list(ids)), t.c.owner == owner).order_by(t.c.id)
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
