"""Paused queues and job names (store/pause_statements.py), on both backends: the answers of pause
and resume, the claim and the poll leaving paused jobs out, run_due and health."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, MetaData

from flask_defer import InvalidArgument, Job, JobStatus
from flask_defer.store import JobStore, NewJob, Pause
from flask_defer.store.schema import define_jobs_table

from ..conftest import AppKit

MakeJob = Callable[..., NewJob]


def insert(store: JobStore, job: NewJob, now: datetime) -> int:
    with store.begin() as conn:
        return store.insert(conn, job, now=now, replace=False).id


def claim(store: JobStore, now: datetime, **kwargs: object) -> list[Job]:
    lease = now + timedelta(seconds=30)
    return store.claim(now=now, limit=10, token=uuid.uuid4().hex, lease_until=lease, **kwargs)  # type: ignore[arg-type]


def get(store: JobStore, job_id: int) -> Job:
    with store.begin() as conn:
        job = store.get(conn, job_id=job_id)
    assert job is not None
    return job


def test_pause_and_resume_say_whether_this_call_changed_it(store: JobStore, now: datetime) -> None:
    assert store.pause(kind="queue", value="emails", now=now, actor="alice") is True
    assert store.pause(kind="queue", value="emails", now=now + timedelta(1), actor="bob") is False
    assert store.pause(kind="name", value="send_digest", now=now, actor="cli") is True
    # The first pause's time and actor are kept; queues come first.
    assert store.paused() == [
        Pause("queue", "emails", now, "alice"),
        Pause("name", "send_digest", now, "cli"),
    ]
    assert store.resume(kind="queue", value="emails") is True
    assert store.resume(kind="queue", value="emails") is False
    assert store.resume(kind="name", value="emails") is False  # a name, not the queue
    assert [p.label for p in store.paused()] == ["name:send_digest"]


def test_pause_refuses_a_kind_that_is_neither_queue_nor_name(
    store: JobStore, now: datetime
) -> None:
    with pytest.raises(InvalidArgument, match="kind: expected 'queue' or 'name'"):
        store.pause(kind="owner", value="alice", now=now, actor="app")
    with pytest.raises(InvalidArgument, match="kind"):
        store.resume(kind="Queue", value="emails")


def test_claim_skips_a_paused_queue_and_keeps_its_jobs_pending_with_their_times(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    early = now - timedelta(minutes=5)
    mail = insert(store, new_job(queue="emails", run_at=early), early)
    report = insert(store, new_job(name="report", queue="reports", run_at=now), early)
    before = get(store, mail)
    store.pause(kind="queue", value="emails", now=now, actor="app")
    assert [job.id for job in claim(store, now)] == [report]
    assert claim(store, now, queues=["emails"]) == []
    assert claim(store, now, look_first=False) == []  # the backlog path says the same
    after = get(store, mail)
    assert after.status is JobStatus.PENDING and after.attempts == 0
    assert (after.run_at, after.due_at) == (before.run_at, before.due_at)

    assert store.resume(kind="queue", value="emails")
    assert [job.id for job in claim(store, now)] == [mail]


def test_claim_skips_a_paused_name_in_any_queue(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    digest = insert(store, new_job(name="send_digest", queue="emails"), now)
    other = insert(store, new_job(name="send_email", queue="emails"), now)
    store.pause(kind="name", value="send_digest", now=now, actor="app")
    assert [job.id for job in claim(store, now)] == [other]
    store.resume(kind="name", value="send_digest")
    assert [job.id for job in claim(store, now)] == [digest]


def test_next_run_at_ignores_paused_jobs(store: JobStore, new_job: MakeJob, now: datetime) -> None:
    # A worker whose only due jobs are paused must sleep, not spin on them.
    insert(store, new_job(queue="emails", run_at=now - timedelta(seconds=5)), now)
    insert(store, new_job(name="send_digest", run_at=now - timedelta(seconds=4)), now)
    later = insert(store, new_job(name="report", run_at=now + timedelta(hours=1)), now)
    store.pause(kind="queue", value="emails", now=now, actor="app")
    store.pause(kind="name", value="send_digest", now=now, actor="app")
    assert store.next_run_at() == get(store, later).run_at
    assert store.next_run_at(queues=["emails"]) is None
    store.resume(kind="queue", value="emails")
    assert store.next_run_at() == now - timedelta(seconds=5)


@pytest.mark.parametrize("backend", ["sqlite"])
def test_sqlite_claim_with_the_pause_condition_still_reads_the_partial_index(
    store: JobStore, now: datetime
) -> None:
    stamp = store.driver.stored_time
    params = {"now": stamp(now), "limit": 10, "token": "t", "lease_until": stamp(now)}
    sql = store.driver._claim_statement("due", False)[0]
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, params).all()
    plan = " / ".join(row[3] for row in rows)
    assert "ix_defer_jobs_pending_priority" in plan and "defer_jobs_pauses" in plan


@pytest.mark.parametrize("backend", ["postgresql"])
def test_resume_wakes_the_workers_of_the_queue(store: JobStore, now: datetime) -> None:
    from flask_defer.engine.wake import Wake, Waker

    store.pause(kind="queue", value="emails", now=now, actor="app")
    store.pause(kind="name", value="send_digest", now=now, actor="app")
    waker = Waker(store.open_listener, queues=["emails"])
    waker.start()
    try:
        assert store.resume(kind="queue", value="emails")
        assert waker.wait(5) is Wake.NOTIFY
        assert store.resume(kind="name", value="send_digest", wake=["emails"])
        assert waker.wait(5) is Wake.NOTIFY
        assert not store.resume(kind="queue", value="emails")  # nothing to wake for
        assert waker.wait(0.3) is Wake.TIMEOUT
    finally:
        waker.close()


def test_queue_counts_are_per_queue_and_bounded(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    for n in range(3):
        insert(store, new_job(queue="emails", run_at=now - timedelta(seconds=n)), now)
    insert(store, new_job(queue="emails", run_at=now + timedelta(hours=1)), now)
    insert(store, new_job(queue="reports", run_at=now - timedelta(seconds=9)), now)
    claim(store, now, queues=["reports"])
    with store.begin() as conn:
        counts, capped = store.queue_counts(conn, now=now, cap=10)
        assert [(c.queue, c.due, c.scheduled, c.running) for c in counts] == [
            ("emails", 3, 1, 0),
            ("reports", 0, 0, 1),
        ]
        assert capped == frozenset()
        counts, capped = store.queue_counts(conn, now=now, cap=2)
    assert counts[0].due == 3 and capped == {"due"}  # read 3 rows: "at least 2"


def test_a_database_without_the_pauses_table_has_no_pauses(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # A schema older than flask_defer_0007, which the web keeps serving until upgraded.
    store = JobStore(engine, define_jobs_table(MetaData()))
    store.create_table(history=False)
    with caplog.at_level(logging.WARNING, logger="flask_defer"):
        assert store.paused() == []
        assert store.paused() == []
    assert len([r for r in caplog.records if "no pauses table" in r.getMessage()]) == 1


# -- through the app: run_due and health ------------------------------------------------


def test_run_due_skips_paused_jobs_and_health_still_counts_them_owed(kit: AppKit) -> None:
    defer = kit.defer
    ran: list[str] = []

    @defer.job("send_email", queue="emails")
    def send_email(job: Job) -> None:
        ran.append("send_email")

    @defer.job("send_digest")
    def send_digest(job: Job) -> None:
        ran.append("send_digest")

    @defer.job("report")
    def report(job: Job) -> None:
        ran.append("report")

    mail = defer.schedule("send_email")
    digest = defer.schedule("send_digest")
    defer.schedule("report")
    kit.db.session.commit()
    assert defer.pause(queue="emails") and defer.pause(name="send_digest")
    later = mail.run_at + timedelta(minutes=2)
    assert defer.run_due(now=later).ran == 1
    assert ran == ["report"]

    health = defer.health(now=later)
    assert health.paused == ("queue:emails", "name:send_digest")
    assert health.owed == 2 and health.oldest_owed_age is not None
    assert health.oldest_owed_age >= 119  # owed since due_at, which the pause kept
    assert health.as_dict()["paused"] == ["queue:emails", "name:send_digest"]

    assert defer.resume(queue="emails") and defer.resume(name="send_digest")
    assert defer.run_due(now=later).ran == 2
    assert sorted(ran) == ["report", "send_digest", "send_email"]
    assert defer.get(digest.id).due_at == digest.due_at  # type: ignore[union-attr]
    assert defer.health(now=later).paused == ()
