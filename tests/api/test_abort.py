"""``defer.abort`` on both backends with real workers: a pending job is cancelled, a
running one is asked to stop (a plain handler sees ``job.abort_requested()``, a
coroutine handler is cancelled), a handler that ignores the request runs to its end,
and ``flask defer abort``."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from flask_defer import Aborted, Job, JobNotFound, JobStatus, job_cancelled
from flask_defer.timeutil import utcnow

from ..conftest import AppKit
from ..engine.test_worker import MakeKit, make_kit
from ..worker_helpers import wait_until, worker_thread

__all__ = ["make_kit"]


class Handlers:
    """Handlers that report when they started and how they ended."""

    def __init__(self, kit: AppKit) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.saw_abort_after: float | None = None
        self.finished = threading.Event()
        defer = kit.defer

        @defer.job("polite", max_attempts=3)
        def polite(job: Job) -> str:
            self.started.set()
            asked = time.monotonic()
            while not job.abort_requested():
                if self.release.wait(0.02):
                    return "finished"
                asked = time.monotonic()
            self.saw_abort_after = time.monotonic() - asked
            if job.payload.get("return"):
                return "stopped early"
            raise Aborted(job.payload.get("why", ""))

        @defer.job("stubborn", max_attempts=3)
        def stubborn(job: Job) -> str:
            self.started.set()
            assert self.release.wait(20)
            self.finished.set()
            return "ran to its end"

        @defer.job("waits_async", max_attempts=3)
        async def waits_async(job: Job) -> str:
            self.started.set()
            try:
                await asyncio.sleep(30)
            finally:
                self.finished.set()
            return "slept"

        @defer.job("after_it", max_attempts=1)
        def after_it(job: Job) -> None:
            return None


@pytest.fixture
def kit(make_kit: MakeKit) -> AppKit:
    return make_kit()


def stored(kit: AppKit, job_id: int) -> Job:
    job = kit.defer.get(job_id)
    assert job is not None
    return job


def history(kit: AppKit, job_id: int) -> list[tuple[str, str]]:
    return [(event.event, event.actor) for event in kit.defer.history(job_id)]


def test_aborting_a_pending_job_cancels_it(kit: AppKit) -> None:
    Handlers(kit)
    job = kit.defer.schedule("polite", delay=60)
    kit.db.session.commit()
    assert kit.defer.abort(job.id, actor="alice") is True
    assert stored(kit, job.id).status is JobStatus.CANCELLED
    assert history(kit, job.id)[-1] == ("cancelled", "alice")
    assert kit.defer.abort(job.id) is False  # settled: nothing to do


def test_aborting_an_unknown_job_raises_and_a_bad_id_names_the_argument(kit: AppKit) -> None:
    with pytest.raises(JobNotFound):
        kit.defer.abort(424242)
    with pytest.raises(Exception, match="id"):
        kit.defer.abort("7")  # type: ignore[arg-type]


def test_a_running_handler_sees_the_request_within_a_heartbeat_and_ends_cancelled(
    kit: AppKit,
) -> None:
    handlers = Handlers(kit)
    job = kit.defer.schedule("polite", {"why": "operator changed their mind"})
    child = kit.defer.schedule("after_it", after=job)
    kit.db.session.commit()
    seen: list[Job] = []
    job_cancelled.connect(lambda sender, job, **_: seen.append(job), weak=False)
    with worker_thread(kit.defer.worker()):
        assert handlers.started.wait(20)
        asked = time.monotonic()
        assert kit.defer.abort(job.id, actor="alice") is True
        assert stored(kit, job.id).abort_requested_by == "alice"
        assert kit.defer.abort(job.id, actor="bob") is False  # asked already
        wait_until(lambda: stored(kit, job.id).status is JobStatus.CANCELLED, timeout=10)
        took = time.monotonic() - asked
    final = stored(kit, job.id)
    assert final.last_error == "operator changed their mind"
    assert final.attempts == 1  # not retried
    assert history(kit, job.id)[-2:] == [("abort_requested", "alice"), ("aborted", "alice")]
    assert took < 5, took  # one heartbeat (0.5 s) in principle; generous on a busy machine
    assert stored(kit, child.id).status is JobStatus.CANCELLED  # its "done" child
    assert any(j.id == job.id for j in seen)


def test_a_handler_that_returns_after_seeing_the_request_ends_cancelled(kit: AppKit) -> None:
    handlers = Handlers(kit)
    job = kit.defer.schedule("polite", {"return": True})
    kit.db.session.commit()
    with worker_thread(kit.defer.worker()):
        assert handlers.started.wait(20)
        kit.defer.abort(job.id, actor="alice")
        wait_until(lambda: stored(kit, job.id).status is JobStatus.CANCELLED, timeout=10)
    assert stored(kit, job.id).result is None
    assert history(kit, job.id)[-1] == ("aborted", "alice")


def test_a_handler_that_ignores_the_request_runs_to_its_end(kit: AppKit) -> None:
    handlers = Handlers(kit)
    job = kit.defer.schedule("stubborn")
    kit.db.session.commit()
    with worker_thread(kit.defer.worker()):
        assert handlers.started.wait(20)
        assert kit.defer.abort(job.id, actor="alice") is True
        time.sleep(1.2)  # more than a heartbeat: the worker knows, the handler never asks
        assert stored(kit, job.id).status is JobStatus.RUNNING
        handlers.release.set()
        wait_until(lambda: stored(kit, job.id).status is JobStatus.DONE, timeout=10)
    assert stored(kit, job.id).result == "ran to its end"
    assert [event for event, _ in history(kit, job.id)][-2:] == ["abort_requested", "done"]


def test_an_async_handler_is_cancelled_on_request(kit: AppKit) -> None:
    handlers = Handlers(kit)
    job = kit.defer.schedule("waits_async")
    kit.db.session.commit()
    with worker_thread(kit.defer.worker()):
        assert handlers.started.wait(20)
        kit.defer.abort(job.id, actor="alice")
        wait_until(lambda: stored(kit, job.id).status is JobStatus.CANCELLED, timeout=10)
    assert handlers.finished.is_set()  # its finally ran: CancelledError at its await
    assert history(kit, job.id)[-1] == ("aborted", "alice")


def test_run_due_looks_for_abort_requests_too(kit: AppKit) -> None:
    handlers = Handlers(kit)
    job = kit.defer.schedule("polite")
    kit.db.session.commit()
    app = kit.app

    def abort_when_started() -> None:
        assert handlers.started.wait(20)
        with app.app_context():
            kit.defer.abort(job.id, actor="cron-operator")

    thread = threading.Thread(target=abort_when_started)
    thread.start()
    summary = kit.defer.run_due()
    thread.join()
    assert summary.counts["aborted"] == 1
    assert stored(kit, job.id).status is JobStatus.CANCELLED


def test_flask_defer_abort_cancels_asks_and_refuses(kit: AppKit) -> None:
    handlers = Handlers(kit)
    pending = kit.defer.schedule("polite", delay=60)
    running = kit.defer.schedule("stubborn")
    kit.db.session.commit()
    cli = kit.app.test_cli_runner()
    result = cli.invoke(args=["defer", "abort", str(pending.id)])
    assert result.exit_code == 0 and f"cancelled job {pending.id}" in result.output
    again = cli.invoke(args=["defer", "abort", str(pending.id)])
    assert again.exit_code == 1 and "is cancelled" in again.output
    missing = cli.invoke(args=["defer", "abort", "999999"])
    assert missing.exit_code == 1 and "no job with id 999999" in missing.output
    with worker_thread(kit.defer.worker()):
        assert handlers.started.wait(20)
        asked = cli.invoke(args=["defer", "abort", str(running.id)])
        assert asked.exit_code == 0 and "abort requested" in asked.output
        twice = cli.invoke(args=["defer", "abort", str(running.id)])
        assert twice.exit_code == 1 and "already requested by cli" in twice.output
        handlers.release.set()
        wait_until(lambda: stored(kit, running.id).status is JobStatus.DONE, timeout=10)


def test_an_operators_retry_starts_clean_of_an_abort_asked_of_an_earlier_run(
    kit: AppKit,
) -> None:
    # Asked to stop, then its worker died and the lease lapsed with no attempt left:
    # failed, the request still on the row. Retried, the new run must not read it.
    started, release = threading.Event(), threading.Event()

    @kit.defer.job("once", max_attempts=1)
    def once(job: Job) -> str:
        started.set()
        while not job.abort_requested():
            if release.wait(0.02):
                return "finished"
        return "stopped early"

    job = kit.defer.schedule("once")
    kit.db.session.commit()
    store = kit.defer.store
    lapsed = utcnow() - timedelta(seconds=1)
    [held] = store.claim(now=utcnow(), limit=1, token="gone", lease_until=lapsed)
    assert kit.defer.abort(job.id, actor="ops") is True  # asked of that run
    assert store.reclaim_lapsed(now=utcnow()) == (0, 1)
    assert stored(kit, job.id).status is JobStatus.FAILED
    kit.defer.retry(job.id)
    with worker_thread(kit.defer.worker()):
        assert started.wait(20)
        time.sleep(1.2)  # past two looks for abort requests (every 0.5 s)
        release.set()
        wait_until(lambda: stored(kit, job.id).status is not JobStatus.RUNNING, timeout=10)
    done = stored(kit, job.id)
    assert (done.status, done.result) == (JobStatus.DONE, "finished")
    assert done.abort_requested_by is None


def test_the_abort_request_is_for_one_run_only(kit: AppKit, monkeypatch: Any) -> None:
    # A request the worker saw is forgotten when the run ends: a later claim of the
    # same job (a retry) starts clean.
    from flask_defer.jobs import ABORTS

    ABORTS.request(99, "token-a")
    assert ABORTS.requested(99, "token-a") and not ABORTS.requested(99, "token-b")
    assert ABORTS.seen(99, "token-a") and ABORTS.was_seen(99, "token-a")
    ABORTS.forget(99, "token-a")
    assert not ABORTS.requested(99, "token-a") and not ABORTS.was_seen(99, "token-a")
