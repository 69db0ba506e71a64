"""The runner: the one claim → execute → acknowledge path of run_due and the worker."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from flask_defer import InvalidArgument, Job, JobStatus
from flask_defer.engine import runner
from flask_defer.store import JobStore
from flask_defer.timeutil import utcnow

from .. import worker_app
from ..conftest import AppKit
from ..worker_helpers import ROOT, wait_until, worker_app_env, worker_thread


def test_run_due_and_the_worker_claim_through_the_same_function(
    kit: AppKit, now: datetime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change to ``runner.claim_due`` is seen by both: here, one job per claim."""
    real = runner.claim_due
    claimed: list[list[int]] = []

    def one_at_a_time(store: JobStore, **kwargs: Any) -> list[Job]:
        kwargs["limit"] = 1
        jobs = real(store, **kwargs)
        claimed.append([job.payload["n"] for job in jobs])
        return jobs

    monkeypatch.setattr(runner, "claim_due", one_at_a_time)
    ran: list[int] = []

    @kit.defer.job("note")
    def note(job: Job) -> None:
        ran.append(job.payload["n"])

    for n in (1, 2):
        kit.defer.schedule("note", {"n": n}, run_at=now)
    kit.db.session.commit()
    summary = kit.defer.run_due(now=now + timedelta(seconds=1))
    assert summary.ran == 2
    assert claimed == [[1], [2], []]  # run_due: one job per claim, then nothing left

    claimed.clear()
    for n in (3, 4):
        kit.defer.schedule("note", {"n": n}, run_at=now)
    kit.db.session.commit()
    worker = kit.defer.worker(burst=True, clock=lambda: now + timedelta(seconds=2))
    worker.run(install_signal_handlers=False)
    assert sorted(ran) == [1, 2, 3, 4]
    # The worker claimed through the same function, so it too took one job at a time.
    assert sorted(n for batch in claimed for n in batch) == [3, 4]
    assert all(len(batch) <= 1 for batch in claimed)
    assert kit.defer.count(status=JobStatus.PENDING) == 0


def test_the_worker_and_run_due_share_one_runner_class(kit: AppKit) -> None:
    worker = kit.defer.worker(burst=True)
    assert isinstance(worker.runner, runner.Runner)
    state = kit.app.extensions["defer"]
    assert isinstance(state.runner, runner.Runner)
    assert worker.runner.executor is state.runner.executor


def test_runner_claims_at_most_its_claim_batch(kit: AppKit, now: datetime) -> None:
    """``Runner.claim`` caps a claim at DEFER_CLAIM_BATCH whatever limit is asked."""
    @kit.defer.job("note")
    def note(job: Job) -> None:
        pass

    for n in range(kit.defer.config.claim_batch + 3):
        kit.defer.schedule("note", {"n": n})
    kit.db.session.commit()
    state = kit.app.extensions["defer"]
    claimed = state.runner.claim(now + timedelta(seconds=1), 1000)
    assert len(claimed) == kit.defer.config.claim_batch
    state.store.release(claimed, now=now)


# -- run_due as a complete cron runner -------------------------------------------------


def load(kit: AppKit, job_id: int) -> Job:
    """The job as the database has it now (a fresh read, outside db.session)."""
    store = kit.defer.store
    with store.engine.connect() as conn:
        job = store.get(conn, job_id=job_id)
    assert job is not None
    return job


def test_run_due_reclaims_a_lapsed_lease_before_claiming(kit: AppKit) -> None:
    """A run that died (no worker anywhere) left the job running; the next run takes it."""
    kit.defer.job("work")(lambda job: "second run")
    job = kit.defer.schedule("work")
    kit.db.session.commit()
    now = utcnow()
    kit.defer.store.claim(
        now=now, limit=1, token=uuid.uuid4().hex, lease_until=now - timedelta(seconds=1)
    )

    summary = kit.defer.run_due()

    assert summary.done == 1
    done = load(kit, job.id)
    assert (done.status, done.attempts, done.result) == (JobStatus.DONE, 2, "second run")


def test_run_due_never_takes_over_a_lease_that_holds_by_the_wall_clock(kit: AppKit) -> None:
    """``now=`` travels in time for what is *due*; leases are judged by the real clock."""
    kit.defer.job("work")(lambda job: None)
    job = kit.defer.schedule("work")
    kit.db.session.commit()
    now = utcnow()
    [held] = kit.defer.store.claim(
        now=now, limit=1, token="live", lease_until=now + timedelta(minutes=1)
    )

    assert kit.defer.run_due(now=now + timedelta(days=1)).ran == 0

    still = load(kit, job.id)
    assert (still.status, still.claim_token) == (JobStatus.RUNNING, "live")
    kit.defer.store.release([held], now=now)


def test_run_due_skips_the_reclaim_while_a_worker_holds_the_maintenance_lock(
    kit: AppKit, backend: str
) -> None:
    """The same lock as the worker's: one process at a time reclaims (PostgreSQL)."""
    kit.defer.job("work")(lambda job: None)
    kit.defer.schedule("work")
    kit.db.session.commit()
    now = utcnow()
    store = kit.defer.store
    store.claim(now=now, limit=1, token="dead", lease_until=now - timedelta(seconds=1))

    with store.maintenance_lock() as mine:
        assert mine
        ran_meanwhile = kit.defer.run_due().ran
    # SQLite has no such lock (its writes are serialised anyway): it reclaims at once.
    assert ran_meanwhile == (0 if backend == "postgresql" else 1)
    assert kit.defer.run_due().ran == (1 if backend == "postgresql" else 0)


def run_due_in_thread(kit: AppKit) -> tuple[threading.Thread, list[Any]]:
    """``run_due`` in a thread of its own with its own app context (a cron process)."""
    results: list[Any] = []

    def run() -> None:
        with kit.app.app_context():
            results.append(kit.defer.run_due())

    thread = threading.Thread(target=run, name="cron")
    thread.start()
    return thread, results


def test_a_run_due_handler_longer_than_the_lease_starts_once_beside_a_worker(
    make_app: Callable[..., AppKit],
) -> None:
    """run_due renews the leases it holds (the worker's heartbeat): the job running and
    the one waiting behind it in the same claimed batch are never reclaimed."""
    # A lease of 1.5 s renewed every 0.5 s leaves a loaded machine a second's slack; the
    # first job outlives three leases.
    kit = make_app(DEFER_LEASE=1.5, DEFER_RECLAIM_INTERVAL=0.1, DEFER_POLL_INTERVAL=0.05)
    starts: list[tuple[int, str]] = []
    lock = threading.Lock()

    @kit.defer.job("long")
    def long(job: Job) -> None:
        with lock:
            starts.append((job.id, threading.current_thread().name))
        time.sleep(job.payload["sleep"])

    results: list[Any] = []

    def cron() -> None:
        with kit.app.app_context():
            results.append(kit.defer.run_due())

    with kit.app.app_context():
        kit.db.create_all()
        first = kit.defer.schedule("long", {"sleep": 4.5})
        second = kit.defer.schedule("long", {"sleep": 0.1}, run_at=first.run_at)
        kit.db.session.commit()
        thread = threading.Thread(target=cron, name="cron")
        thread.start()
        try:
            wait_until(lambda: starts)  # run_due holds both jobs now
            with worker_thread(kit.defer.worker(concurrency=2)) as worker:
                thread.join(30)
                assert not thread.is_alive()
        finally:
            thread.join(30)

        assert starts == [(first.id, "cron"), (second.id, "cron")]
        assert results[0].done == 2
        assert worker.summary.ran == 0
        assert load(kit, first.id).attempts == 1


def test_run_due_stops_starting_jobs_after_max_seconds(kit: AppKit) -> None:
    """Claimed jobs not started by the limit go back to pending, attempt not spent."""
    ran: list[int] = []

    @kit.defer.job("slow")
    def slow(job: Job) -> None:
        ran.append(job.payload["n"])
        time.sleep(1.2)

    jobs = [kit.defer.schedule("slow", {"n": n}) for n in range(4)]
    kit.db.session.commit()

    summary = kit.defer.run_due(max_seconds=1.0)

    assert (summary.ran, summary.out_of_time, ran) == (1, True, [0])
    rest = [load(kit, job.id) for job in jobs[1:]]
    assert [(j.status, j.attempts, j.run_at) for j in rest] == [
        (JobStatus.PENDING, 0, job.run_at) for job in jobs[1:]
    ]
    assert kit.defer.run_due(max_seconds=timedelta(minutes=5), limit=1).out_of_time is False


@pytest.mark.parametrize("bad", [0, -1, "5", True, float("nan"), float("inf"), 10**20])
def test_run_due_max_seconds_must_be_a_positive_duration(kit: AppKit, bad: Any) -> None:
    with pytest.raises(InvalidArgument) as refused:
        kit.defer.run_due(max_seconds=bad)
    assert refused.value.argument == "max_seconds"


# -- a cron run killed inside a handler -----------------------------------------------


def run_due_process(database_url: str, log: Path, **config: Any) -> subprocess.Popen[bytes]:
    """``flask --app tests.worker_app defer run-due`` as a real child process."""
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "flask", "--app", "tests.worker_app", "defer", "run-due"],
            cwd=ROOT,
            env=worker_app_env(database_url, **config),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@pytest.mark.slow
def test_a_killed_run_due_is_recovered_by_the_next_run_due_alone(
    database_url: str, tmp_path: Path
) -> None:
    """kill -9 inside a handler; no worker anywhere. The next cron run waits out the
    lease, then takes the job back and runs it: two starts, one finish."""
    app = worker_app.create_app(database_url)
    try:
        with app.app_context():
            job = worker_app.defer.schedule("slow_first", {"sleep": 60})
            worker_app.db.session.commit()
        first = run_due_process(database_url, tmp_path / "first.log", DEFER_LEASE=3)
        try:
            wait_until(lambda: [r.phase for r in worker_app.runs(app)] == ["started"])
        finally:
            first.kill()  # SIGKILL: no shutdown, no release
            first.wait(10)
        with app.app_context():
            assert worker_app.defer.get(job.id).status is JobStatus.RUNNING  # type: ignore[union-attr]
            # While the dead run's lease holds, a cron run leaves the job alone.
            assert worker_app.defer.run_due().ran == 0

        def next_cron_run() -> str | None:
            log = tmp_path / "next.log"
            process = run_due_process(database_url, log, DEFER_LEASE=3)
            assert process.wait(60) == 0, log.read_text()
            output = log.read_text()
            return output if "ran 1 job(s)" in output else None

        # The first runs may come while the lease still holds; they find nothing.
        output = wait_until(next_cron_run, timeout=40, interval=0.5)
        assert "done 1" in output
        runs = worker_app.runs(app)
        assert [(r.phase, r.attempt) for r in runs] == [
            ("started", 1), ("started", 2), ("finished", 2)
        ]
        assert runs[0].pid == first.pid and runs[1].pid != first.pid
        with app.app_context():
            done = worker_app.defer.get(job.id)
            assert done is not None and (done.status, done.attempts) == (JobStatus.DONE, 2)
    finally:
        with app.app_context():
            worker_app.db.session.remove()
            worker_app.db.engine.dispose()
