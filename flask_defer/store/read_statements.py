"""Reads: single jobs, filtered lists, the health figures and an owner's toasts."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    String,
    bindparam,
    case,
    column,
    func,
    literal_column,
    select,
    text,
)
from sqlalchemy.exc import OperationalError

from ..jobs import Job, JobStatus
from .core import StoreBase
from .records import (
    SCHEDULED_COUNT_CAP,
    SETTLED_COUNT_CAP,
    UNKNOWN_HANDLER_NOTE,
    JobFilter,
    StatusCounts,
)
from .schema import LIVE_STATUSES, UTCDateTime


class ReadStatements(StoreBase):
    """Reads: single jobs, filtered lists, the health figures and an owner's toasts."""

    #: How many settled rows per status health counts at most (see counts_by_name).
    settled_cap: int = SETTLED_COUNT_CAP
    #: How many scheduled (pending, not yet due) rows health counts at most.
    scheduled_cap: int = SCHEDULED_COUNT_CAP
    _counts_sql: Any = None
    #: False once SQLite said an index the counts name is missing (see counts_by_name).
    _counts_indexed_by: bool = True

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
        scheduled_cap: int | None = None,
    ) -> list[StatusCounts]:
        """Per job name: counts by status, scheduled vs owed, oldest owed, lapsed leases.

        One statement of seven grouped parts, each read from an index alone (revision
        ``flask_defer_0005``), so its cost follows the work owed, not the table's size:

        * owed (pending and due, or running), failed and "waiting for a handler" are
          exact: the backlog, the dead letters and the alarms;
        * scheduled (pending, not due yet) is counted over the *scheduled_cap* soonest
          rows: exact below the cap, a lower bound at it (then ``pending`` is in
          ``lower_bounds``), because a calendar of a million future jobs is not work
          owed and counting it would make every health check read all of it;
        * the settled statuses (done, cancelled) grow without bound until pruned, so
          they are counted over the *settled_cap* most recently finished rows, a lower
          bound at the cap (listed in ``lower_bounds``), so the dashboard shows
          "1,000+".

        "Owed" ages from ``due_at``, which retries do not move. Pending jobs a worker
        left for want of a handler are counted per name (``unknown_to_worker``).
        """
        # Long because: the seven parts' rows fill one per-name record; split, the
        # partial records would travel between functions.
        settled = self.settled_cap if settled_cap is None else settled_cap
        scheduled = self.scheduled_cap if scheduled_cap is None else scheduled_cap
        params = {
            "now": now,
            # The note holds no LIKE wildcard (% or _), so it needs no escaping.
            "note": UNKNOWN_HANDLER_NOTE + "%",
            "scheduled_window": scheduled + 1,
            "settled_window": settled + 1,
        }
        parts: dict[str, dict[str, Any]] = {}
        totals: dict[str, int] = {}
        try:
            rows = conn.execute(self._counts_statement(), params).all()
        except OperationalError as error:
            # A database without the indexes of revision flask_defer_0005 (not upgraded
            # yet; the web keeps serving): count without naming them.
            if not self._lost_pending_index(error):
                raise
            self._counts_sql = None
            rows = conn.execute(self._counts_statement(), params).all()
        for kind, name, n, oldest, lapsed in rows:
            part = parts.setdefault(name, _empty_part())
            n = int(n)
            totals[kind] = totals.get(kind, 0) + n
            by_status = part["by_status"]
            if kind == _OWED or kind == _SCHEDULED:
                by_status["pending"] = by_status.get("pending", 0) + n
                part["owed" if kind == _OWED else "scheduled"] += n
            elif kind == _UNKNOWN:
                part["unknown"] = n
            else:
                by_status[kind] = n
                if kind == JobStatus.RUNNING.value:
                    part["owed"] += n
                    part["lapsed"] = int(lapsed)
            if oldest is not None and (part["oldest"] is None or oldest < part["oldest"]):
                part["oldest"] = oldest
        capped = {s for s in _SETTLED if totals.get(s, 0) > settled}
        if totals.get(_SCHEDULED, 0) > scheduled:
            capped.add(JobStatus.PENDING.value)
        # Past a cap every name's figure is "at least": rows of a name that missed the
        # window may exist too.
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

    def _counts_statement(self) -> Any:
        """The statement of :meth:`counts_by_name`, built once per store; binds: ``now``,
        ``note`` (a LIKE pattern), ``scheduled_window`` and ``settled_window``.

        Rows are (part, name, count, oldest due_at, lapsed leases). Every part states
        its status as a literal, the predicate of the partial index it reads, and names
        only columns that index holds, so PostgreSQL scans the index alone (given a
        visibility map: autovacuum keeps it) and SQLite uses it as a covering index.
        SQLite without ``ANALYZE`` statistics would rather walk every pending row
        through the (status, finished_at, name) index, so the pending parts name their
        index (``INDEXED BY``, which SQLAlchemy does not render: hence text).
        """
        # Long because: one statement's seven parts, kept together so each part's
        # index and predicate can be read against the others.
        cached = self._counts_sql
        if cached is not None:
            return cached
        jobs = self._quoted_table
        by_time = jobs + self.driver.index_hint(f"ix_{self.table.name}_pending_run_at_name")
        by_error = jobs + self.driver.index_hint(f"ix_{self.table.name}_pending_errors")
        none = self.driver.null_time
        settled = [
            f"SELECT '{status}', name, count(*), {none}, 0 FROM ("
            f"SELECT name FROM {jobs} WHERE status = '{status}'"
            f" ORDER BY finished_at DESC LIMIT :settled_window) AS latest_{status}"
            " GROUP BY name"
            for status in _SETTLED
        ]
        sql = " UNION ALL ".join(
            [
                f"SELECT '{_OWED}' AS kind, name, count(*) AS n, min(due_at) AS oldest,"
                f" 0 AS lapsed FROM {by_time} WHERE {_READY} AND run_at <= :now"
                " GROUP BY name",
                f"SELECT '{_SCHEDULED}', name, count(*), {none}, 0 FROM ("
                f"SELECT name FROM {by_time} WHERE {_READY} AND run_at > :now"
                " ORDER BY run_at LIMIT :scheduled_window) AS soonest GROUP BY name",
                "SELECT 'running', name, count(*), min(due_at),"
                " count(*) FILTER (WHERE lease_expires_at < :now)"
                f" FROM {jobs} WHERE status = 'running' GROUP BY name",
                f"SELECT 'failed', name, count(*), {none}, 0 FROM {jobs}"
                " WHERE status = 'failed' GROUP BY name",
                # "last_error IS NOT NULL": the predicate of the partial index on
                # pending rows with an error, which holds the few rows this looks for.
                f"SELECT '{_UNKNOWN}', name, count(*), {none}, 0 FROM {by_error}"
                " WHERE status = 'pending' AND last_error IS NOT NULL"
                " AND last_error LIKE :note GROUP BY name",
                *settled,
            ]
        )
        stmt = (
            text(sql)
            .bindparams(
                bindparam("now", type_=UTCDateTime()),
                bindparam("note", type_=String()),
                bindparam("scheduled_window", type_=Integer()),
                bindparam("settled_window", type_=Integer()),
            )
            # SQLite hands min() back as text: the UTCDateTime column parses it.
            .columns(
                column("kind", String()),
                column("name", String()),
                column("n", Integer()),
                column("oldest", UTCDateTime()),
                column("lapsed", Integer()),
            )
        )
        self._counts_sql = stmt
        return stmt

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


#: The parts of the counts statement that are not a status: pending and due, pending
#: and not due yet, pending and left by a worker without a handler.
_OWED, _SCHEDULED, _UNKNOWN = "owed", "scheduled", "unknown"
#: The predicate of the pending index by time: pending, not waiting for parents.
_READY = "status = 'pending' AND waiting_for IS NULL"
_SETTLED = (JobStatus.DONE.value, JobStatus.CANCELLED.value, JobStatus.EXPIRED.value)


def _empty_part() -> dict[str, Any]:
    return {"scheduled": 0, "owed": 0, "oldest": None, "lapsed": 0, "unknown": 0, "by_status": {}}
