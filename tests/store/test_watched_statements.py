"""Statements the drivers run past SQLAlchemy's execution are still seen by whoever
watches the engine (SQL logging, tracing), on both backends: the acknowledgement batch
here, the claim in ``test_store_claims``."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event

from flask_defer.store import Ack, JobStore, NewJob

MakeJob = Callable[..., NewJob]


@pytest.fixture
def seen(history_store: JobStore) -> Iterator[list[str]]:
    statements: list[str] = []

    def watch(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(" ".join(statement.replace('"', "").split()))

    event.listen(history_store.engine, "after_cursor_execute", watch)
    yield statements
    event.remove(history_store.engine, "after_cursor_execute", watch)


def test_a_watched_engine_sees_the_acknowledgement_batch(
    history_store: JobStore, seen: list[str], new_job: MakeJob, now: datetime
) -> None:
    with history_store.begin() as conn:
        for _ in range(3):
            history_store.insert(conn, new_job(run_at=now), now=now, replace=False)
    token = uuid.uuid4().hex
    jobs = history_store.claim(
        now=now, limit=3, token=token, lease_until=now + timedelta(minutes=1)
    )
    seen.clear()
    acks = [Ack(job.id, token, "done", attempt=job.attempts) for job in jobs]
    assert history_store.acknowledge_many(acks, now=now) == {job.id for job in jobs}
    updates = [sql for sql in seen if "UPDATE defer_jobs" in sql]
    assert updates, seen
    with history_store.begin() as conn:
        for job in jobs:
            assert [e.event for e in history_store.history(conn, job.id)][-1] == "done"
