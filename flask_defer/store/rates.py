"""Rate limits' bookkeeping: the starts each bucket counts, and which buckets are full.

A rate-limited job (``@defer.job(..., rate_limit="10/s")``) is a keyed job whose
``concurrency_key`` is its bucket, so the keyed claim (``claim_sql.keyed_ids_sql``),
which every worker runs under one lock per table, decides whether it may start: fewer
than ``rate_limit`` of the bucket's starts may still count. Each start it makes is a row
here, written by :meth:`RateStatements.record_starts` in the claim's own transaction,
counting until the claim's time plus the period: a sliding window, not a fixed one.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import Connection, delete, func, insert, literal_column, select

from ..jobs import Job
from .history import HistoryStatements
from .schema import LIVE_STATUSES


class RateStatements(HistoryStatements):
    """Record rate-limited starts, forget old ones, and name the full buckets."""

    def record_starts(self, conn: Connection, jobs: Sequence[Job], now: datetime) -> None:
        """Count the rate-limited ones among *jobs*, just claimed in *conn*'s
        transaction (under the keyed claim's lock), in their buckets: one row each,
        counting until *now* plus the limit's period."""
        rows = [
            {"bucket": job.concurrency_key, "until": now + timedelta(seconds=job.rate_period)}
            for job in jobs
            if job.rate_limit is not None and job.rate_period is not None
        ]
        if rows:
            conn.execute(insert(self.starts_table), rows)

    def forget_old_starts(self, *, now: datetime) -> int:
        """Delete the starts that no longer count (``until`` passed); how many. Looks
        first, so a maintenance round with none takes no write lock."""
        s = self.starts_table
        old = s.c.until <= now
        with self.engine.connect() as conn:
            if conn.execute(select(s.c.id).where(old).limit(1)).first() is None:
                return 0
        with self.begin_immediate() as conn:
            return int(conn.execute(delete(s).where(old)).rowcount)

    def bucket_frees_at(
        self, conn: Connection, bucket: str, *, limit: int, now: datetime
    ) -> datetime | None:
        """When *bucket* (a rate limit of *limit*) next has room: None if it has room
        now, else when its oldest start still counting stops counting."""
        s = self.starts_table
        counted = (s.c.bucket == bucket) & (s.c.until > now)
        n, first = conn.execute(select(func.count(), func.min(s.c.until)).where(counted)).one()
        return None if int(n) < limit else first

    def key_holders(self, conn: Connection, key: str) -> list[int]:
        """The running jobs of concurrency key *key* (the keyed live index)."""
        t = self.table
        rows = conn.execute(
            select(t.c.id)
            .where(
                t.c.status.in_(["pending", "running"]),
                t.c.concurrency_key == key,
                t.c.status == "running",
            )
            .order_by(t.c.id)
        )
        return [int(job_id) for job_id in rows.scalars()]

    def full_buckets(self, conn: Connection, *, now: datetime, limit: int = 50) -> tuple[str, ...]:
        """The rate buckets that hold due jobs back at *now* (at most *limit*): full (as
        many starts within the period as the limit) while a due job waits in them.

        Read from the starts still counting, bucket by bucket, then one look per bucket
        at its live keyed rows (``ix_<table>_keyed_live``): its cost follows the rate
        limits in use, not the backlog. A bucket with no start counting is never full
        (a limit is at least 1). Read from the due pending rows instead, SQLite walked
        every due row through the run_at index, keyed or not (11 of health()'s 20 ms
        over 10,000 due jobs and no rate limit at all).
        """
        t, s = self.table, self.starts_table
        counting = (
            select(s.c.bucket, func.count().label("n"))
            .where(s.c.until > now)
            .group_by(s.c.bucket)
            .subquery("counting")
        )
        held_back = (
            select(t.c.id)
            .where(
                t.c.concurrency_key == counting.c.bucket,
                # The keyed live index's own predicate, so SQLite may use it too.
                t.c.status.in_([literal_column(f"'{status}'") for status in LIVE_STATUSES]),
                self._is_pending(),
                t.c.waiting_for.is_(None),
                t.c.rate_limit.is_not(None),
                t.c.run_at <= now,
                t.c.rate_limit <= counting.c.n,
            )
            .exists()
        )
        stmt = (
            select(counting.c.bucket)
            .where(held_back)
            .order_by(counting.c.bucket)
            .limit(limit)
        )
        return tuple(str(bucket) for bucket in conn.execute(stmt).scalars())
