"""The worker's handler pool (pool.py): one job per idle thread, withdrawals."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

from flask_defer.execution import Outcome
from flask_defer.jobs import Job, JobStatus
from flask_defer.pool import HandlerPool

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def job(job_id: int) -> Job:
    return Job(
        id=job_id,
        name="noop",
        payload=None,
        status=JobStatus.RUNNING,
        run_at=NOW,
        due_at=NOW,
        attempts=0,
        max_attempts=3,
        queue="default",
    )


def test_the_pool_takes_one_job_per_idle_thread_and_frees_each_after_its_outcome() -> None:
    go = threading.Event()
    done: list[int] = []
    freed = threading.Semaphore(0)

    def run(j: Job) -> Outcome:
        go.wait(5)
        return Outcome.DONE

    pool = HandlerPool(2, run, lambda outcome, ours: done.append(1), freed.release)
    pool.start()
    try:
        assert pool.free() == 2
        pool.submit(job(1), None)
        pool.submit(job(2), None)
        assert pool.free() == 0 and pool.busy()
        assert sorted(j.id for j in pool.in_flight()) == [1, 2]
        go.set()
        assert freed.acquire(timeout=5) and freed.acquire(timeout=5)
        assert pool.wait_idle(5) and pool.free() == 2 and len(done) == 2
    finally:
        pool.close()


def test_a_job_withdrawn_before_a_thread_took_it_never_runs() -> None:
    entered, go = threading.Event(), threading.Event()
    ran: list[int] = []

    def run(j: Job) -> Outcome:
        ran.append(j.id)
        entered.set()
        go.wait(5)
        return Outcome.DONE

    pool = HandlerPool(1, run, lambda outcome, ours: None)
    pool.start()
    try:
        pool.submit(job(1), None)
        assert entered.wait(5)
        pool.submit(job(2), None)  # the one thread is busy: job 2 waits in the queue
        withdrawn = pool.withdraw_queued()
        assert [t.job.id for t in withdrawn] == [2]
        go.set()
        assert pool.wait_idle(5)
        time.sleep(0.05)
        assert ran == [1]
    finally:
        pool.close()
