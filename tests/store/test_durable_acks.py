"""SQLite: a batch of outcomes is on disk when acknowledge_many returns, yet the write
lock is handed on before the disk is waited for (WAL at synchronous FULL)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData, create_engine, event, text

import flask_defer.store.sqlite as sqlite_driver
from flask_defer.jobs import Job, JobStatus
from flask_defer.store import Ack, JobStore, NewJob
from flask_defer.store.schema import define_jobs_table
from flask_defer.store.sqlite import durability

SQLITE = pytest.mark.parametrize("backend", ["sqlite"])

MakeJob = Callable[..., NewJob]


def claimed_job(store: JobStore, new_job: MakeJob, now: datetime) -> Job:
    with store.begin() as conn:
        store.insert(conn, new_job(run_at=now), now=now, replace=False)
    (job,) = store.claim(
        now=now, limit=1, token=uuid.uuid4().hex, lease_until=now + timedelta(minutes=1)
    )
    return job


def done(job: Job) -> Ack:
    return Ack(job.id, job.claim_token or "", JobStatus.DONE.value, attempt=job.attempts)


def status_of(store: JobStore, job: Job) -> str:
    with store.engine.connect() as conn:
        found = conn.execute(text("SELECT status FROM defer_jobs WHERE id = :id"), {"id": job.id})
        return str(found.scalar_one())


@SQLITE
def test_the_write_lock_is_handed_on_before_the_log_is_synced_and_the_ack_returns_after(
    store: JobStore, new_job: MakeJob, now: datetime, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = claimed_job(store, new_job, now)
    syncing, go_on = threading.Event(), threading.Event()
    synced: list[str] = []
    real_sync = durability.sync_file

    def slow_sync(path: str) -> None:
        syncing.set()
        assert go_on.wait(10)
        real_sync(path)
        synced.append(path)

    monkeypatch.setattr(sqlite_driver, "sync_file", slow_sync)
    returned: list[set[int]] = []
    acking = threading.Thread(
        target=lambda: returned.append(store.acknowledge_many([done(job)], now=now))
    )
    acking.start()
    assert syncing.wait(10)
    # The disk is being waited for: another writer already gets the lock, and sees the
    # outcome committed, while the acknowledgement has not returned.
    with store.begin_immediate() as conn:
        assert conn.execute(text("SELECT status FROM defer_jobs")).scalar_one() == "done"
    assert returned == []
    go_on.set()
    acking.join(10)
    assert returned == [{job.id}]
    database = store.engine.url.database
    assert synced == [f"{database}-wal"]


@SQLITE
def test_an_acknowledgement_leaves_its_connection_at_the_synchronous_level_it_found(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    job = claimed_job(store, new_job, now)
    levels: list[int] = []

    def level(dbapi_connection: Any, _record: Any) -> None:
        levels.append(dbapi_connection.execute("PRAGMA synchronous").fetchone()[0])

    event.listen(store.engine, "checkin", level)
    try:
        assert store.acknowledge_many([done(job)], now=now) == {job.id}
    finally:
        event.remove(store.engine, "checkin", level)
    assert levels and set(levels) == {2}  # FULL, SQLite's default, as before the ack
    assert status_of(store, job) == "done"


def test_outside_wal_mode_an_acknowledgement_commits_synced_under_the_lock(
    tmp_path: Path, new_job: MakeJob, now: datetime, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'rollback-journal.sqlite3'}")

    @event.listens_for(engine, "connect")
    def _journal(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute("PRAGMA journal_mode = DELETE")

    store = JobStore(engine, define_jobs_table(MetaData()))
    store.create_table()
    synced: list[str] = []
    monkeypatch.setattr(sqlite_driver, "sync_file", synced.append)
    try:
        job = claimed_job(store, new_job, now)
        assert store.acknowledge_many([done(job)], now=now) == {job.id}
        assert status_of(store, job) == "done"
    finally:
        engine.dispose()
    assert synced == []  # SQLite's own commit waited for the disk, inside the lock


@SQLITE
def test_a_failing_acknowledgement_raises_sqlalchemys_error_and_writes_nothing(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    """The worker's flusher retries a batch on SQLAlchemy's errors; sqlite3's own would
    have been taken for a bad batch and dropped."""
    from sqlalchemy.exc import IntegrityError

    job = claimed_job(store, new_job, now)
    with store.begin() as conn:
        conn.execute(
            text(
                "CREATE TRIGGER refuse BEFORE UPDATE ON defer_jobs"
                " BEGIN SELECT RAISE(ABORT, 'the disk says no'); END"
            )
        )
    with pytest.raises(IntegrityError, match="the disk says no"):
        store.acknowledge_many([done(job)], now=now)
    assert status_of(store, job) == "running"
