"""Behind a transaction-mode pooler: a real PgBouncer in front of the suite's PostgreSQL.

What managed PostgreSQL hands out: each transaction may run on another server
connection, so a LISTEN hears nothing and a statement psycopg prepared on one server
connection is missing on the next. The library says so and how to fix it, works with
prepared statements off, and gives the worker's LISTEN a direct connection
(``DEFER_LISTEN_DATABASE_URI``).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import create_engine, text

from flask_defer import Job, NotConfigured
from flask_defer.engine.wake import Waker
from flask_defer.timeutil import utcnow

from .. import worker_app
from ..conftest import AppKit
from ..pg_bouncer import PgBouncer
from ..worker_helpers import WorkerProcess, wait_until, worker_thread

pytestmark = pytest.mark.parametrize("backend", ["postgresql"])

#: psycopg without server-side prepared statements: what a pooled URL needs.
NO_PREPARE = {"connect_args": {"prepare_threshold": None}}


@pytest.fixture(scope="session")
def bouncer(postgres_server_url: str) -> Iterator[PgBouncer]:
    pooler = PgBouncer(postgres_server_url)
    pooler.start()
    yield pooler
    pooler.stop()


@pytest.fixture
def pooled_app(
    make_app: Callable[..., AppKit], database_url: str, bouncer: PgBouncer
) -> Callable[..., AppKit]:
    """Factory: an app whose database URL is the pooler's, tables created directly."""

    def through_pooler(**config: Any) -> AppKit:
        config.setdefault("SQLALCHEMY_DATABASE_URI", bouncer.pooled(database_url))
        kit = make_app(**config)
        with kit.app.app_context():
            kit.db.create_all()
        return kit

    return through_pooler


def test_a_lost_prepared_statement_is_an_error_naming_the_pooler_and_the_fix(
    make_app: Callable[..., AppKit],
) -> None:
    # PostgreSQL's own error for a prepared statement a server connection lacks, as a
    # pooler causes it; raised here without one, so the test is deterministic.
    kit = make_app()
    with kit.app.app_context(), pytest.raises(NotConfigured) as raised:
        kit.db.session.execute(text("EXECUTE flask_defer_no_such_statement"))
    message = str(raised.value)
    assert "transaction-mode pooler" in message and "prepare_threshold" in message
    assert "DEFER_LISTEN_DATABASE_URI" in message


def test_with_prepared_statements_off_everything_works_through_the_pooler(
    pooled_app: Callable[..., AppKit], database_url: str
) -> None:
    kit = pooled_app(
        SQLALCHEMY_ENGINE_OPTIONS=NO_PREPARE,
        DEFER_LISTEN_DATABASE_URI=database_url,
        DEFER_POLL_INTERVAL=0.05,
    )
    ran: list[int] = []

    @kit.defer.job("send")
    def send(job: Job) -> None:
        ran.append(job.payload["n"])

    with kit.app.app_context():
        # Far more than psycopg's 5 runs before it would prepare a statement.
        for n in range(60):
            job = kit.defer.schedule("send", {"n": n}, key=f"k:{n}", delay=3600)
            kit.db.session.commit()
            if n % 3 == 0:
                assert kit.defer.cancel(job.id) is True
            else:
                kit.defer.reschedule(job.id, run_at=utcnow() - timedelta(seconds=1))
        summary = kit.defer.worker(burst=True, concurrency=4).run(install_signal_handlers=False)
    assert summary.done == 40 and sorted(ran) == [n for n in range(60) if n % 3]


def test_a_listen_through_the_pooler_is_found_deaf_and_the_worker_polls(
    bouncer: PgBouncer, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    pooled = create_engine(bouncer.pooled(database_url), **NO_PREPARE)  # type: ignore[arg-type]

    def open_listener() -> Any:
        raw = pooled.raw_connection()
        conn: Any = raw.driver_connection
        raw.detach()
        conn.autocommit = True
        conn.execute('LISTEN "flask_defer"')
        conn.execute('LISTEN "flask_defer_probe"')
        return conn

    def probe(token: str) -> None:
        with pooled.connect() as conn:
            conn.execute(text("SELECT pg_notify('flask_defer_probe', :t)"), {"t": token})
            conn.commit()

    waker = Waker(open_listener, probe=probe, probe_timeout=0.5)
    try:
        with caplog.at_level(logging.WARNING, logger="flask_defer.worker"):
            waker.start()
            began = time.monotonic()
            while time.monotonic() - began < 1.5:
                waker.wait(0.1)
        assert waker.deaf and not waker.listening
        assert "DEFER_LISTEN_DATABASE_URI" in caplog.text
    finally:
        waker.close()
        pooled.dispose()


def test_a_direct_listen_hears_its_test_and_wakes_the_worker_at_once(
    pooled_app: Callable[..., AppKit], database_url: str
) -> None:
    # Polls and sleeps far longer than the test: only a NOTIFY heard can start the job.
    kit = pooled_app(
        SQLALCHEMY_ENGINE_OPTIONS=NO_PREPARE,
        DEFER_LISTEN_DATABASE_URI=database_url,
        DEFER_POLL_INTERVAL=30,
        DEFER_MAX_SLEEP=30,
    )
    started: list[float] = []

    @kit.defer.job("ping")
    def ping(job: Job) -> None:
        started.append(time.monotonic())

    with kit.app.app_context():
        worker = kit.defer.worker(concurrency=2)
        with worker_thread(worker):
            wait_until(lambda: worker.waker.listening, timeout=10)
            assert not worker.waker.deaf
            time.sleep(0.2)  # the worker is asleep now
            scheduled = time.monotonic()
            kit.defer.schedule("ping")
            kit.db.session.commit()
            wait_until(lambda: started, timeout=10)
    assert started[0] - scheduled < 1.0


# -- two worker processes behind the pooler ----------------------------------------------


@pytest.fixture
def spawn(tmp_path: Any) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(database_url: str, *args: str, **config: Any) -> WorkerProcess:
        process = WorkerProcess(database_url, tmp_path / f"worker-{len(started)}.log",
                                *args, **config)  # fmt: skip
        started.append(process)
        return process

    yield start
    for process in started:
        process.close()


def _lateness(app: Flask, jobs: list[Job]) -> list[float]:
    """Each job's claim (its started event) after its run_at, in seconds."""
    with app.app_context():
        late = []
        for job in jobs:
            (started,) = [e.at for e in worker_app.defer.history(job.id) if e.event == "started"]
            late.append((started - job.run_at).total_seconds())
    return sorted(late)


@pytest.mark.slow
@pytest.mark.alone
def test_two_workers_behind_the_pooler_run_each_job_once_on_time(
    bouncer: PgBouncer, database_url: str, spawn: Callable[..., WorkerProcess]
) -> None:
    pooled = bouncer.pooled(database_url)
    app = worker_app.create_app(pooled, SQLALCHEMY_ENGINE_OPTIONS=NO_PREPARE)
    settings = {
        "SQLALCHEMY_ENGINE_OPTIONS": NO_PREPARE,
        "DEFER_LISTEN_DATABASE_URI": database_url,
        "DEFER_POLL_INTERVAL": 5,  # only a NOTIFY heard can make them punctual
    }
    workers = [spawn(pooled, "--concurrency", "4", **settings) for _ in range(2)]
    for worker in workers:
        worker.wait_started()
    try:
        with app.app_context():
            wait_until(lambda: len([w for w in worker_app.defer.workers()
                                    if w.listening]) == 2, timeout=20)  # fmt: skip
            soon = utcnow() + timedelta(seconds=1)
            jobs = [worker_app.defer.schedule("record", {"n": n},
                                              run_at=soon + timedelta(milliseconds=20 * n))
                    for n in range(100)]  # fmt: skip
            worker_app.db.session.commit()
        wait_until(lambda: len(worker_app.runs(app)) == 100, timeout=60, interval=0.2)
        late = _lateness(app, jobs)
        per_job = Counter(run.job_id for run in worker_app.runs(app))
        assert len(per_job) == 100 and max(per_job.values()) == 1, "a job ran twice"
        p99 = late[98]
        # Woken by NOTIFY through the direct LISTEN, not by the 5 s poll: a poll would
        # leave most jobs seconds late. Milliseconds here: 1.5-4 ms on a quiet host, 21 ms
        # once alone in a slow hour, 48 ms once under the suite's load (so it runs
        # alone). The bound tells a wake-up from a poll; the lateness target itself
        # (p99 <= 20 ms) is measured by bench/, not asserted by a timed test.
        assert p99 <= 0.250, f"lateness p99 {p99 * 1000:.1f} ms: {late[-5:]}"
        for worker in workers:
            assert "Traceback" not in worker.log() and "ERROR" not in worker.log()
    finally:
        with app.app_context():
            worker_app.db.session.remove()
            worker_app.db.engine.dispose()


@pytest.mark.slow
def test_without_a_direct_listen_workers_poll_say_so_and_are_never_later_than_the_poll(
    bouncer: PgBouncer, database_url: str, spawn: Callable[..., WorkerProcess]
) -> None:
    pooled = bouncer.pooled(database_url)
    app = worker_app.create_app(pooled, SQLALCHEMY_ENGINE_OPTIONS=NO_PREPARE)
    poll = 0.5
    settings = {"SQLALCHEMY_ENGINE_OPTIONS": NO_PREPARE, "DEFER_POLL_INTERVAL": poll}
    workers = [spawn(pooled, **settings) for _ in range(2)]
    for worker in workers:
        worker.wait_started()
    try:
        with app.app_context():
            # The LISTEN through the pooler hears nothing: both workers find out and say
            # so in their rows, which health() and the dashboard read.
            wait_until(lambda: len(worker_app.defer.health().deaf_workers) == 2, timeout=20)
            jobs = []
            for n in range(6):  # sparse: one at a time, each due while the workers sleep
                due = utcnow() + timedelta(seconds=0.7)
                jobs.append(worker_app.defer.schedule("record", {"n": n}, run_at=due))
                worker_app.db.session.commit()
                time.sleep(0.9)
        wait_until(lambda: len(worker_app.runs(app)) == 6, timeout=30, interval=0.2)
        late = _lateness(app, jobs)
        assert late[-1] <= poll + 0.1, f"{late[-1]:.3f} s late, the poll is {poll} s"
        for worker in workers:
            log = worker.log()
            assert "DEFER_LISTEN_DATABASE_URI" in log and "Traceback" not in log
    finally:
        with app.app_context():
            worker_app.db.session.remove()
            worker_app.db.engine.dispose()
