"""The worker's handler pool (pool.py): one job per idle thread, withdrawals."""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import QueuePool

from flask_defer.engine.execution import Outcome
from flask_defer.engine.pool import HandlerPool, warn_if_connections_short
from flask_defer.jobs import Job, JobStatus

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


@pytest.mark.parametrize(
    ("pool_size", "overflow", "level"),
    [(2, 0, logging.WARNING), (5, 10, logging.INFO), (20, 10, None)],
)
def test_a_pool_short_of_connections_is_a_note_and_short_of_the_workers_own_a_warning(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    pool_size: int,
    overflow: int,
    level: int | None,
) -> None:
    engine = create_engine(
        f"sqlite:///{tmp_path / 'pool.db'}",
        poolclass=QueuePool,
        pool_size=pool_size,
        max_overflow=overflow,
    )
    try:
        with caplog.at_level(logging.INFO, logger="flask_defer"):
            warn_if_connections_short(engine, 20)
    finally:
        engine.dispose()
    levels = [r.levelno for r in caplog.records if "pool allows" in r.getMessage()]
    assert levels == ([] if level is None else [level])
