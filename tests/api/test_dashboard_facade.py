"""The facade and store methods the dashboard needs, on SQLite and PostgreSQL.

``run_now``, ``count``, ``retry_many``, ``cancel_many(status=)`` and the
authorisation hook, each from Python, without HTTP.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from flask_defer import InvalidArgument, Job, JobNotFound, JobNotPending, JobStatus
from flask_defer.store import JobFilter, JobStore, NewJob

from ..conftest import AppKit


@pytest.fixture
def handlers(kit: AppKit) -> AppKit:
    @kit.defer.job("ok")
    def ok(job: Job) -> None:
        pass

    @kit.defer.job("boom", max_attempts=1)
    def boom(job: Job) -> None:
        raise RuntimeError("boom")

    return kit


def claim_all(kit: AppKit) -> list[Job]:
    now = datetime.now(UTC)
    return kit.defer.store.claim(
        now=now, limit=100, token=uuid.uuid4().hex, lease_until=now + timedelta(minutes=1)
    )


def test_run_now_makes_a_pending_job_due_now(handlers: AppKit) -> None:
    defer = handlers.defer
    job = defer.schedule("ok", delay=timedelta(days=3))
    handlers.db.session.commit()
    before = datetime.now(UTC)
    moved = defer.run_now(job.id)
    assert moved.status is JobStatus.PENDING
    assert before <= moved.run_at <= datetime.now(UTC)
    assert moved.due_at == moved.run_at
    assert defer.run_due().done == 1


def test_run_now_of_a_running_or_settled_job_raises_not_pending(handlers: AppKit) -> None:
    defer = handlers.defer
    running = defer.schedule("ok")
    handlers.db.session.commit()
    claim_all(handlers)
    with pytest.raises(JobNotPending) as raised:
        defer.run_now(running.id)
    assert raised.value.status == "running"
    with pytest.raises(JobNotFound):
        defer.run_now(10**9)
    with pytest.raises(InvalidArgument, match="id"):
        defer.run_now(True)


def test_count_agrees_with_list(handlers: AppKit) -> None:
    defer = handlers.defer
    for n in range(3):
        defer.schedule("ok", key=f"a:{n}", owner="ann")
    defer.schedule("boom", key="b:1", delay=60)
    handlers.db.session.commit()
    assert defer.count() == 4
    assert defer.count(name="ok") == 3
    assert defer.count(key_prefix="a:") == 3 and defer.count(key_prefix="A:") == 0
    assert defer.count(owner="ann", status="pending") == 3
    assert defer.count(status=["done", "failed"]) == 0
    assert defer.count(name="boom") == len(defer.list(name="boom"))
    with pytest.raises(InvalidArgument, match="status"):
        defer.count(status="exploded")


def test_retry_many_retries_only_failed_jobs_and_resets_attempts(handlers: AppKit) -> None:
    defer = handlers.defer
    failed = [defer.schedule("boom", key=f"b:{n}") for n in range(2)]
    pending = defer.schedule("boom", key="b:later", delay=timedelta(hours=1))
    handlers.db.session.commit()
    assert defer.run_due().failed == 2
    assert defer.retry_many(status="pending") == 0
    assert defer.retry_many(name="ok") == 0
    assert defer.retry_many(key_prefix="b:") == 2
    for job in failed:
        again = defer.get(job.id)
        assert again is not None and again.status is JobStatus.PENDING and again.attempts == 0
    assert defer.get(pending.id) == pending
    assert defer.retry_many() == 0  # nothing failed any more


def test_cancel_many_honours_a_status_filter(handlers: AppKit) -> None:
    defer = handlers.defer
    job = defer.schedule("ok", key="k:1", delay=60)
    handlers.db.session.commit()
    assert defer.cancel_many(key_prefix="k:", status="failed") == {"cancelled": 0, "in_flight": 0}
    assert defer.cancel_many(key_prefix="k:", status="pending") == {"cancelled": 1, "in_flight": 0}
    cancelled = defer.get(job.id)
    assert cancelled is not None and cancelled.status is JobStatus.CANCELLED
    with pytest.raises(InvalidArgument, match="refusing to cancel every job"):
        defer.cancel_many(status="pending")


def test_the_dashboard_is_closed_until_a_hook_or_debug_opens_it(
    make_app: Callable[..., AppKit],
) -> None:
    kit = make_app()
    answers: list[object] = []
    with kit.app.test_request_context("/defer/"):
        assert not kit.defer.dashboard_allowed()
        kit.app.debug = True
        assert kit.defer.dashboard_allowed()
        kit.app.debug = False

        @kit.defer.dashboard_auth
        def hook() -> object:
            return answers[-1]

        for answer, allowed in ((False, False), (None, False), (True, True), ("admin", True)):
            answers.append(answer)
            assert kit.defer.dashboard_allowed() is allowed
    with pytest.raises(InvalidArgument, match="hook"):
        kit.defer.dashboard_auth("not a function")  # type: ignore[arg-type]


def test_store_retry_failed_many_is_one_guarded_statement(
    store: JobStore, new_job: Callable[..., NewJob], now: datetime
) -> None:
    with store.begin() as conn:
        ids = [
            store.insert(conn, new_job(key=f"x:{n}"), now=now, replace=False).id for n in range(3)
        ]
    claimed = store.claim(now=now, limit=3, token="t", lease_until=now + timedelta(minutes=1))
    assert store.ack_failed(claimed[0], now=now, error="boom")
    assert store.ack_failed(claimed[1], now=now, error="boom")
    later = now + timedelta(minutes=5)
    with store.begin() as conn:
        assert store.retry_failed_many(conn, JobFilter(key_prefix="x:"), now=later) == 2
        assert store.retry_failed_many(conn, JobFilter(), now=later) == 0
        jobs = {job.id: job for job in store.find(conn, JobFilter(), limit=10)}
    for job_id in ids[:2]:
        job = jobs[job_id]
        assert job.status is JobStatus.PENDING and job.attempts == 0
        assert job.run_at == later and job.due_at == later and job.finished_at is None
        assert job.last_error == "boom"
    assert jobs[ids[2]].status is JobStatus.RUNNING  # never touched
