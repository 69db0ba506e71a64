"""Reads: single jobs, filtered lists, the health figures and an owner's toasts."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    case,
    func,
    literal_column,
    select,
    type_coerce,
)

from ..jobs import Job, JobStatus
from ..schema import LIVE_STATUSES, UTCDateTime
from .base import StoreBase
from .records import (
    SETTLED_COUNT_CAP,
    UNKNOWN_HANDLER_NOTE,
    JobFilter,
    StatusCounts,
)


class ReadStatements(StoreBase):
    """Reads: single jobs, filtered lists, the health figures and an owner's toasts."""

    #: How many settled rows per status health counts at most (see counts_by_name).
    settled_cap: int = SETTLED_COUNT_CAP

    def any_lapsed(self, *, now: datetime) -> bool:
        """True if some running job's lease lapsed before *now*.

        One step into the partial index on running leases, without a write lock: a
        ``run_due`` with nothing to reclaim must not make the web's writes wait (SQLite)
        or take the maintenance lock (PostgreSQL).
        """
        t = self.table
        # A literal status, so both databases match the query to the partial index.
        running = t.c.status == literal_column(f"'{JobStatus.RUNNING.value}'")
        stmt = select(t.c.id).where(running, t.c.lease_expires_at < now).limit(1)
        with self.engine.connect() as conn:
            return conn.execute(stmt).first() is not None

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

    def count(self, conn: Connection, where: JobFilter, *, limit: int | None = None) -> int:
        """How many jobs match *where*; with *limit*, counting stops there.

        A bounded count reads at most *limit* index entries, so a dashboard over a
        table of a million settled rows answers in milliseconds ("10,000+") instead of
        scanning them all on every refresh.
        """
        t = self.table
        if limit is None:
            stmt = select(func.count()).select_from(t).where(self._filter(where))
        else:
            matching = select(t.c.id).where(self._filter(where)).limit(limit).subquery()
            stmt = select(func.count()).select_from(matching)
        return int(conn.execute(stmt).scalar_one())

    def counts_by_name(
        self,
        conn: Connection,
        *,
        now: datetime,
        settled_cap: int | None = None,
    ) -> list[StatusCounts]:
        """Per job name: counts by status, scheduled vs owed, oldest owed, lapsed leases.

        Live rows (pending, running) and dead letters (failed) are counted exactly in
        one grouped pass that reads only those rows, through the indexes on them. The
        settled statuses (done, cancelled) grow without bound until pruned, so they
        are counted over at most *settled_cap* rows each (the most recently finished):
        exact below the cap, a lower bound at it, and then listed in
        ``StatusCounts.lower_bounds`` so the dashboard can show "10,000+". "Owed" is
        pending-and-due or running; its age is measured from ``due_at``, which retries
        do not move. Pending jobs a worker left for want of a handler are counted per
        name too (``unknown_to_worker``), so health needs no second pass.
        """
        # Long because: one grouped pass over live rows and the capped settled windows fill
        # one per-name record; split, the partial records would travel between functions.
        t = self.table
        cap = self.settled_cap if settled_cap is None else settled_cap
        pending = t.c.status == JobStatus.PENDING.value
        running = t.c.status == JobStatus.RUNNING.value
        unknown_to_worker = pending & t.c.last_error.startswith(
            UNKNOWN_HANDLER_NOTE, autoescape=True
        )
        exact = (JobStatus.PENDING, JobStatus.RUNNING, JobStatus.FAILED)
        # Grouped by (name, status, due): a few groups of plain counts instead of a
        # dozen FILTER aggregates evaluated on every live row (3x cheaper measured on
        # 100,000 pending rows).
        due = case((t.c.run_at <= now, 1), else_=0)
        live = (
            select(
                t.c.name,
                t.c.status,
                due,
                func.count(),
                # type_coerce: SQLite hands aggregates back as text; this parses them.
                type_coerce(func.min(t.c.due_at), UTCDateTime()),
                func.count().filter(running & (t.c.lease_expires_at < now)),
                func.count().filter(unknown_to_worker),
            )
            .where(
                # Literal statuses: both planners may then use the indexes whose
                # leading column or predicate is the status instead of the table.
                t.c.status.in_([literal_column(f"'{s.value}'") for s in exact])
            )
            .group_by(t.c.name, t.c.status, due)
        )
        parts: dict[str, dict[str, Any]] = {}
        for name, status, is_due, n, oldest, lapsed, unknown in conn.execute(live):
            part = parts.setdefault(name, _empty_part())
            n = int(n)
            part["by_status"][status] = part["by_status"].get(status, 0) + n
            part["lapsed"] += int(lapsed)
            part["unknown"] += int(unknown)
            if status == JobStatus.PENDING.value and not is_due:
                part["scheduled"] += n
            elif status in (JobStatus.PENDING.value, JobStatus.RUNNING.value):
                part["owed"] += n
                if oldest is not None and (part["oldest"] is None or oldest < part["oldest"]):
                    part["oldest"] = oldest
        capped: set[str] = set()
        for status in (JobStatus.DONE, JobStatus.CANCELLED):
            per_name, at_cap = self._settled_window(conn, status, cap)
            if at_cap:
                capped.add(status.value)
            for name, n in per_name.items():
                parts.setdefault(name, _empty_part())["by_status"][status.value] = n
        # Past the cap every name's figure is "at least": older rows of a name that
        # missed the window may exist too.
        lower_bounds = frozenset(capped)
        return [
            StatusCounts(
                name=name,
                by_status={s.value: part["by_status"].get(s.value, 0) for s in JobStatus},
                scheduled=part["scheduled"],
                owed=part["owed"],
                oldest_owed_due_at=part["oldest"],
                lapsed_leases=part["lapsed"],
                unknown_to_worker=part["unknown"],
                lower_bounds=lower_bounds,
            )
            for name, part in parts.items()
        ]

    def _settled_window(
        self, conn: Connection, status: JobStatus, cap: int
    ) -> tuple[dict[str, int], bool]:
        """Per name, how many of the latest *cap* rows in *status* it has; and if capped.

        Reads at most *cap* + 1 rows, newest first through the (status, finished_at)
        index; the one past the cap tells a table of exactly *cap* from a larger one.
        """
        t = self.table
        window = (
            select(t.c.name)
            .where(t.c.status == literal_column(f"'{status.value}'"))
            .order_by(t.c.finished_at.desc())
            .limit(cap + 1)
            .subquery()
        )
        stmt = select(window.c.name, func.count()).group_by(window.c.name)
        per_name = {name: int(n) for name, n in conn.execute(stmt)}
        return per_name, sum(per_name.values()) > cap

    def status_counts(self, conn: Connection, *, now: datetime) -> StatusCounts:
        """The figures of :meth:`counts_by_name`, summed over every name."""
        return StatusCounts.total(self.counts_by_name(conn, now=now))

    def count_unknown(self, conn: Connection, known_names: Collection[str]) -> int:
        """Pending jobs whose name has no handler among *known_names*, or in a worker.

        A worker that met a name it does not know left the job pending with
        :data:`UNKNOWN_HANDLER_NOTE`; those count too, because during a rolling deploy
        the web process may know a name its workers do not know yet. (Health computes
        the same figure from :meth:`counts_by_name`, see :meth:`StatusCounts.unknown`.)
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


def _empty_part() -> dict[str, Any]:
    return {"scheduled": 0, "owed": 0, "oldest": None, "lapsed": 0, "unknown": 0, "by_status": {}}
