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
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from flask_defer import Job, NotConfigured
from flask_defer.engine.wake import Waker
from flask_defer.timeutil import utcnow

from ..conftest import AppKit
from ..pg_bouncer import PgBouncer
from ..worker_helpers import wait_until, worker_thread

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
