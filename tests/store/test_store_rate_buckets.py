"""Which rate buckets hold due jobs back (``health().rate_limited``), on a bare store,
both backends: the answer, and on SQLite the plan that keeps it cheap."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, insert

from flask_defer.store import JobStore, NewJob

MakeJob = Callable[..., NewJob]


def rate_limited(new_job: MakeJob, bucket: str, run_at: datetime, limit: int = 2) -> NewJob:
    return new_job(run_at=run_at, concurrency_key=bucket, rate_limit=limit, rate_period=60.0)


def add(store: JobStore, jobs: list[NewJob], now: datetime) -> None:
    with store.begin() as conn:
        for job in jobs:
            store.insert(conn, job, now=now, replace=False)


def started(store: JobStore, bucket: str, times: int, until: datetime) -> None:
    with store.begin() as conn:
        rows = [{"bucket": bucket, "until": until} for _ in range(times)]
        conn.execute(insert(store.starts_table), rows)


def full(store: JobStore, now: datetime) -> tuple[str, ...]:
    with store.begin() as conn:
        return store.full_buckets(conn, now=now)


def test_a_bucket_is_full_only_at_its_limit_and_only_while_a_due_job_waits_in_it(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    later = now + timedelta(hours=1)
    add(
        store,
        [
            rate_limited(new_job, "at-limit", now),  # 2 starts of 2: held back
            rate_limited(new_job, "under-limit", now),  # 1 start of 2: room
            rate_limited(new_job, "not-due", later),  # full, but nothing due waits
            rate_limited(new_job, "lapsed", now),  # its starts no longer count
            new_job(run_at=now),  # unkeyed, due: never in a bucket
        ],
        now,
    )
    counting, gone = now + timedelta(seconds=30), now - timedelta(seconds=1)
    started(store, "at-limit", 2, counting)
    started(store, "under-limit", 1, counting)
    started(store, "not-due", 2, later + timedelta(seconds=30))
    started(store, "lapsed", 2, gone)
    started(store, "no-job", 5, counting)  # full, but no job of it left
    assert full(store, now) == ("at-limit",)
    # The job that was not due falls due: its full bucket now holds it back.
    assert full(store, later) == ("not-due",)  # by then the others' starts lapsed


@pytest.mark.parametrize("backend", ["sqlite"])
def test_the_full_bucket_look_follows_the_counting_starts_not_the_due_backlog(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    """health() asks this on every call: read from the due rows, SQLite walked every due
    job, keyed or not, through the run_at index (11 of health()'s 20 ms over 10,000)."""
    add(store, [new_job(run_at=now) for _ in range(50)], now)
    add(store, [rate_limited(new_job, "a", now)], now)
    started(store, "a", 2, now + timedelta(seconds=30))
    seen: dict[str, Any] = {}

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        seen.update(statement=statement, parameters=parameters)

    event.listen(store.engine, "before_cursor_execute", capture)
    try:
        assert full(store, now) == ("a",)
    finally:
        event.remove(store.engine, "before_cursor_execute", capture)
    with store.engine.connect() as conn:
        dbapi: Any = conn.connection.driver_connection
        explained = dbapi.execute("EXPLAIN QUERY PLAN " + seen["statement"], seen["parameters"])
        plan = " | ".join(row[3] for row in explained)
    assert "keyed_live" in plan, plan
    assert "pending_run_at_name" not in plan and "SCAN defer_jobs " not in plan + " ", plan
