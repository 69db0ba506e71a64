"""Coroutine (``async def``) handlers: the worker's event loop, run_due, and their limits.

On SQLite and PostgreSQL, as the rest of the worker tests.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from typing import Any

import pytest
from flask import current_app

from flask_defer import InvalidArgument, Job, JobStatus

from ..worker_helpers import wait_until, worker_thread
from .test_worker import MakeKit, burst, load, make_kit

__all__ = ["make_kit"]  # the fixture, shared with the worker's own tests


def test_coroutine_handlers_wait_together_without_holding_the_one_thread(
    make_kit: MakeKit,
) -> None:
    kit = make_kit()
    apps: list[str] = []

    @kit.defer.job("slow_call")
    async def slow_call(job: Job) -> int:
        await asyncio.sleep(0.5)
        apps.append(current_app.name)  # each task has the app context pushed
        return int(job.payload["n"])

    jobs = [kit.defer.schedule("slow_call", {"n": n}) for n in range(20)]
    kit.db.session.commit()
    started = time.monotonic()
    summary = burst(kit, concurrency=1)
    took = time.monotonic() - started
    assert summary.done == 20
    # One thread awaiting them one by one would take 10 s.
    assert took < 5, f"20 half-second coroutines took {took:.1f} s on one thread"
    assert apps == [kit.app.name] * 20
    assert [load(kit, job.id).result for job in jobs] == list(range(20))
    assert all(load(kit, job.id).attempts == 1 for job in jobs)


def test_a_coroutine_past_its_timeout_is_cancelled_and_fails_the_attempt(
    make_kit: MakeKit,
) -> None:
    kit = make_kit()
    cancelled = threading.Event()

    @kit.defer.job("hangs", timeout=0.2, max_attempts=1)
    async def hangs(job: Job) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    job = kit.defer.schedule("hangs")
    kit.db.session.commit()
    summary = burst(kit)
    assert summary.failed == 1 and cancelled.is_set()
    failed = load(kit, job.id)
    assert failed.status is JobStatus.FAILED
    assert "timeout of 0.2 s" in (failed.last_error or "")


def test_a_coroutine_that_raises_is_retried_like_a_thread_handler(make_kit: MakeKit) -> None:
    kit = make_kit(DEFER_RETRY_BASE=60)
    seen: list[int] = []

    @kit.defer.job("flaky", max_attempts=3)
    async def flaky(job: Job) -> str:
        seen.append(job.attempts)
        if job.attempts == 1:
            raise ConnectionError("api is down")
        return "ok"

    job = kit.defer.schedule("flaky")
    kit.db.session.commit()
    burst(kit)
    retried = load(kit, job.id)
    assert retried.status is JobStatus.PENDING and "api is down" in (retried.last_error or "")
    kit.defer.run_due(now=retried.run_at)
    assert load(kit, job.id).status is JobStatus.DONE and load(kit, job.id).result == "ok"
    assert seen == [1, 2]


def test_run_due_awaits_a_coroutine_handler_on_a_loop_of_its_own(make_kit: MakeKit) -> None:
    kit = make_kit()

    @kit.defer.job("async_add")
    async def async_add(job: Job) -> int:
        await asyncio.sleep(0)
        return int(job.payload["a"]) + 1

    job = kit.defer.schedule("async_add", {"a": 41})
    kit.db.session.commit()
    summary = kit.defer.run_due()
    assert summary.done == 1 and load(kit, job.id).result == 42


def test_run_due_from_a_thread_that_runs_an_event_loop_still_awaits_the_handler(
    make_kit: MakeKit,
) -> None:
    """run_due called from async code (or under Playwright's sync API, a notebook): the
    thread's loop is running, so the handler runs on a loop of its own beside it."""
    kit = make_kit()

    @kit.defer.job("async_add")
    async def async_add(job: Job) -> int:
        await asyncio.sleep(0)
        return int(job.payload["a"]) + 1

    job = kit.defer.schedule("async_add", {"a": 41})
    kit.db.session.commit()

    async def from_async_code() -> Any:
        return kit.defer.run_due()

    # On a thread of its own (with this thread's app context), so that the loop it
    # runs is the only one there, whatever else this test process runs.
    answer: list[Any] = []
    context = contextvars.copy_context()
    caller = threading.Thread(
        target=context.run, args=(lambda: answer.append(asyncio.run(from_async_code())),)
    )
    caller.start()
    caller.join(30)
    [summary] = answer
    assert summary.done == 1 and load(kit, job.id).result == 42


def test_a_stop_past_the_grace_hands_a_running_coroutine_back_to_pending(
    make_kit: MakeKit,
) -> None:
    kit = make_kit(DEFER_SHUTDOWN_GRACE=0.3)
    entered = threading.Event()

    @kit.defer.job("long_call")
    async def long_call(job: Job) -> None:
        entered.set()
        await asyncio.sleep(30)

    job = kit.defer.schedule("long_call")
    kit.db.session.commit()
    with worker_thread(kit.defer.worker()) as worker:
        assert entered.wait(10)
        wait_until(lambda: worker.coroutines.busy())
    released = load(kit, job.id)
    assert released.status is JobStatus.PENDING
    assert released.attempts == 0 and released.claim_token is None


def test_a_full_event_loop_stops_the_claims_until_a_coroutine_ends(make_kit: MakeKit) -> None:
    kit = make_kit(DEFER_ASYNC_CONCURRENCY=2)
    go = asyncio.Event()
    running: list[int] = []
    loop_of: list[asyncio.AbstractEventLoop] = []

    @kit.defer.job("gate")
    async def gate(job: Job) -> None:
        loop_of.append(asyncio.get_running_loop())
        running.append(job.id)
        await go.wait()

    jobs = [kit.defer.schedule("gate") for _ in range(4)]
    kit.db.session.commit()
    with worker_thread(kit.defer.worker(concurrency=4)):
        wait_until(lambda: len(running) == 2)
        time.sleep(0.3)  # time for a wrong worker to claim more
        assert len(running) == 2
        assert sorted(j.status.value for j in (load(kit, job.id) for job in jobs)) == [
            "pending",
            "pending",
            "running",
            "running",
        ]
        loop_of[0].call_soon_threadsafe(go.set)
        wait_until(lambda: all(load(kit, job.id).status is JobStatus.DONE for job in jobs))


def test_an_async_handler_cannot_be_atomic(make_kit: MakeKit) -> None:
    kit = make_kit()
    with pytest.raises(InvalidArgument, match="atomic"):

        @kit.defer.job("atomic_async", atomic=True)
        async def atomic_async(job: Job) -> None:
            await asyncio.sleep(0)
