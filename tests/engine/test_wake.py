"""The waker: local wake-ups, NOTIFY, and a LISTEN connection that comes back."""

from __future__ import annotations

import threading
import time
from datetime import datetime

import pytest
from sqlalchemy import text

from flask_defer.engine.wake import Wake, Waker
from flask_defer.store import JobStore

from ..worker_helpers import wait_until


def test_wait_times_out_and_wake_ends_it_early() -> None:
    waker = Waker()
    waker.start()
    try:
        started = time.monotonic()
        assert waker.wait(0.05) is Wake.TIMEOUT
        assert time.monotonic() - started >= 0.05
        threading.Timer(0.05, waker.wake).start()
        assert waker.wait(10) is Wake.LOCAL
        waker.wake()  # a wake before the wait is not lost
        assert waker.wait(10) is Wake.LOCAL
        assert not waker.listening
    finally:
        waker.close()
    waker.wake()  # harmless once closed


def test_waker_must_be_started() -> None:
    with pytest.raises(RuntimeError, match="start"):
        Waker().wait(0)


@pytest.mark.parametrize("backend", ["postgresql"])
def test_notify_wakes_only_for_our_queues(store: JobStore) -> None:
    waker = Waker(store.open_listener, queues=["mail"])
    waker.start()
    try:
        assert waker.listening
        with store.begin() as conn:
            store.notify(conn, "reports")
        assert waker.wait(0.5) is Wake.TIMEOUT
        with store.begin() as conn:
            store.notify(conn, "mail")
        assert waker.wait(5) is Wake.NOTIFY
        assert waker.notifications == 1
    finally:
        waker.close()


@pytest.mark.parametrize("backend", ["postgresql"])
def test_lost_listen_connection_is_reopened(store: JobStore, now: datetime) -> None:
    waker = Waker(store.open_listener)
    waker.start()
    try:
        with store.begin() as conn:
            killed = conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"
                    " AND datname = current_database()"
                )
            ).scalars().all()
        assert killed == [True]
        reasons = []
        wait_until(lambda: reasons.append(waker.wait(0.2)) or Wake.RECONNECTED in reasons)
        assert waker.listening
        with store.begin() as conn:
            store.notify(conn, "default")
        assert waker.wait(5) is Wake.NOTIFY
    finally:
        waker.close()
