"""The activity aggregate: runs started, done, failed and retried per minute and per
hour, by queue and job name, with a lateness histogram (``defer.activity``, the
dashboard's Activity page).

Workers count in memory and write here every few seconds (``engine.activity``): one
upsert of a minute row and an hour row per (queue, name) they ran, adding to what is
there, so workers side by side sum up. The upsert is the dialect's own ``INSERT ...
ON CONFLICT DO UPDATE`` construct, which the driver hands out (``insert_ignoring``).
Reads are range scans of the primary key: at most an hour of minutes or a week of hours
per (queue, name), however many jobs ran. Maintenance deletes minute rows after
:data:`MINUTES_KEPT` and hour rows after :data:`HOURS_KEPT`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, delete, func, select, text

from .history import HistoryStatements

#: The lateness buckets' upper bounds, in seconds (the last catches everything).
LATENESS_BOUNDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0, 300.0, float("inf"))
#: How long minute rows and hour rows are kept.
MINUTES_KEPT = timedelta(hours=2)
HOURS_KEPT = timedelta(days=8)
#: The two spans of a row.
MINUTE, HOUR = "m", "h"


@dataclass
class ActivityRow:
    """Counts of one (minute, queue, name) as a worker gathers them."""

    start: datetime
    queue: str
    name: str
    started: int = 0
    done: int = 0
    failed: int = 0
    retried: int = 0
    lateness: list[int] = field(default_factory=lambda: [0] * len(LATENESS_BOUNDS))

    def plus(self, other: ActivityRow) -> ActivityRow:
        """The sum of two rows of one key."""
        return ActivityRow(
            self.start, self.queue, self.name, self.started + other.started,
            self.done + other.done, self.failed + other.failed,
            self.retried + other.retried,
            [a + b for a, b in zip(self.lateness, other.lateness, strict=True)],
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class ActivityBucket:
    """One minute or hour of activity, as ``defer.activity()`` returns it.

    ``start`` is the bucket's first moment (UTC). ``started`` counts runs started
    (each attempt), ``done``, ``failed`` (out of attempts, or ``Fail``) and
    ``retried`` their outcomes. ``lateness_p50`` and ``lateness_p95`` (seconds, None
    without runs) are read from a histogram: each is the upper bound of the bucket the
    percentile falls in (10 ms, 50 ms, 100 ms, 250 ms, 500 ms, 1 s, 5 s, 30 s, 5 min),
    an upper estimate.
    """

    start: datetime
    started: int = 0
    done: int = 0
    failed: int = 0
    retried: int = 0
    lateness_p50: float | None = None
    lateness_p95: float | None = None


def _percentile(histogram: Sequence[int], fraction: float) -> float | None:
    total = sum(histogram)
    if not total:
        return None
    seen = 0
    for bound, n in zip(LATENESS_BOUNDS, histogram, strict=True):
        seen += n
        if seen >= fraction * total:
            return bound if bound != float("inf") else LATENESS_BOUNDS[-2]
    return None


def _late_columns() -> list[str]:
    return [f"late_{i}" for i in range(len(LATENESS_BOUNDS))]


class ActivityStatements(HistoryStatements):
    """Write, read and prune the activity aggregate."""

    #: :meth:`_activity_upsert`'s statement, once built.
    _activity_upsert_sql: Any = None

    def record_activity(self, rows: Sequence[ActivityRow]) -> None:
        """Add *rows* to their minute and their hour (one upsert, its own transaction)."""
        late = _late_columns()
        # One row per (span, start, queue, name) in the statement: an upsert may not
        # touch one row twice, and two minutes of a batch share their hour.
        merged: dict[tuple[str, datetime, str, str], ActivityRow] = {}
        for row in rows:
            for span, start in ((MINUTE, row.start), (HOUR, row.start.replace(minute=0))):
                key = (span, start, row.queue, row.name)
                kept = merged.get(key)
                moved = ActivityRow(start, row.queue, row.name, row.started, row.done,
                                    row.failed, row.retried, list(row.lateness))  # fmt: skip
                merged[key] = moved if kept is None else kept.plus(moved)
        values = [
            {"span": span, "start": start, "queue": queue, "name": name,
             "started": r.started, "done": r.done, "failed": r.failed, "retried": r.retried,
             **dict(zip(late, r.lateness, strict=True))}
            for (span, start, queue, name), r in merged.items()
        ]  # fmt: skip
        with self.begin() as conn:
            conn.execute(self._activity_upsert(), values)

    def _activity_upsert(self) -> Any:
        """The upsert of one activity row, built once and run with a list of rows.

        SQL text, which SQLAlchemy compiles once and caches: its own ``ON CONFLICT DO
        UPDATE`` construct is compiled anew at every execution (it has no cache key),
        and that compile, of a multi-row ``VALUES`` besides, was a fifth of a one-job
        ``run_due()`` (profiled). ``INSERT ... ON CONFLICT (...) DO UPDATE`` with
        ``excluded`` reads the same on SQLite and PostgreSQL; each time column keeps its
        type, so its values are converted as the table's are.
        """
        cached = self._activity_upsert_sql
        if cached is not None:
            return cached
        a = self.activity_table
        preparer = self.engine.dialect.identifier_preparer
        table, quote = preparer.format_table(a), preparer.quote
        names = [column.name for column in a.c]
        added = ("started", "done", "failed", "retried", *_late_columns())
        sql = (
            f"INSERT INTO {table} ({', '.join(quote(n) for n in names)})"
            f" VALUES ({', '.join(':' + n for n in names)})"
            f" ON CONFLICT ({', '.join(quote(n) for n in ('span', 'start', 'queue', 'name'))})"
            " DO UPDATE SET "
            + ", ".join(f"{quote(n)} = {table}.{quote(n)} + excluded.{quote(n)}" for n in added)
        )
        stmt = text(sql).bindparams(*[bindparam(n, type_=a.c[n].type) for n in names])
        self._activity_upsert_sql = stmt
        return stmt

    def activity(
        self,
        *,
        since: datetime,
        span: str,
        queue: str | None = None,
        name: str | None = None,
    ) -> list[ActivityBucket]:
        """The buckets of *span* (``m`` or ``h``) from *since* on, summed over the queues
        and names (or only *queue*, *name*), oldest first; empty buckets left out."""
        a = self.activity_table
        late = _late_columns()
        conditions = [a.c.span == span, a.c.start >= since]
        if queue is not None:
            conditions.append(a.c.queue == queue)
        if name is not None:
            conditions.append(a.c.name == name)
        # Summed by the database: a week of hours is one row per hour however many
        # queues and names ran (adding up their rows here cost 8-20 ms at ten keys).
        counted = ("started", "done", "failed", "retried", *late)
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(a.c.start, *[func.sum(a.c[c]) for c in counted])
                .where(*conditions)
                .group_by(a.c.start)
                .order_by(a.c.start)
            ).all()
        buckets = []
        for row in rows:
            counts = [int(value or 0) for value in row[1:]]
            buckets.append(
                ActivityBucket(
                    row[0], started=counts[0], done=counts[1], failed=counts[2],
                    retried=counts[3], lateness_p50=_percentile(counts[4:], 0.5),
                    lateness_p95=_percentile(counts[4:], 0.95),
                )  # fmt: skip
            )
        return buckets

    def activity_keys(self, *, since: datetime) -> tuple[list[str], list[str]]:
        """The queues and job names with activity since *since* (the page's filters)."""
        a = self.activity_table
        with self.engine.connect() as conn:
            found = conn.execute(
                select(a.c.queue, a.c.name).where(a.c.span == HOUR, a.c.start >= since).distinct()
            ).all()
        return sorted({q for q, _ in found}), sorted({n for _, n in found})

    def forget_old_activity(self, *, now: datetime) -> int:
        """Delete minute rows older than :data:`MINUTES_KEPT`, hour rows older than
        :data:`HOURS_KEPT`; how many."""
        a = self.activity_table
        old = ((a.c.span == MINUTE) & (a.c.start < now - MINUTES_KEPT)) | (
            (a.c.span == HOUR) & (a.c.start < now - HOURS_KEPT)
        )
        with self.engine.connect() as conn:
            if conn.execute(select(a.c.span).where(old).limit(1)).first() is None:
                return 0
        with self.begin_immediate() as conn:
            return int(conn.execute(delete(a).where(old)).rowcount)
