"""A worker's loop and flusher keep their autocommit connection between statements
(``JobStore.keeping_connections``), while busy, and give it back cleanly: on
PostgreSQL each pooled connection planned the claim anew until it had prepared it."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from flask_defer.jobs import Job
from flask_defer.store import JobStore, NewJob

from ..pg_databases import kill_server_side

MakeJob = Callable[..., NewJob]


def insert(store: JobStore, job: NewJob, now: datetime) -> int:
    with store.begin() as conn:
        return store.insert(conn, job, now=now, replace=False).id


def claim(store: JobStore, now: datetime, limit: int = 10) -> list[Job]:
    lease = now + timedelta(minutes=1)
    return store.claim(
        now=now, limit=limit, token=uuid.uuid4().hex, lease_until=lease, look_first=False
    )


@contextmanager
def counting_checkouts(store: JobStore) -> Iterator[list[Any]]:
    """The DBAPI connection of every checkout from the store's pool in the block."""
    seen: list[Any] = []

    def checked_out(dbapi: Any, *_args: Any) -> None:
        seen.append(dbapi)

    event.listen(store.engine, "checkout", checked_out)
    try:
        yield seen
    finally:
        event.remove(store.engine, "checkout", checked_out)


def backend_pid(store: JobStore) -> int:
    with store.autocommit() as conn:
        return int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())


def test_claims_inside_keeping_connections_work_and_leave_nothing_checked_out(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    ids = [insert(store, new_job(run_at=now), now) for _ in range(6)]
    with store.keeping_connections():
        claimed = [job.id for _ in range(3) for job in claim(store, now, limit=2)]
    assert sorted(claimed) == ids
    assert store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_keeping_thread_runs_its_autocommit_statements_on_one_connection(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    for _ in range(10):
        insert(store, new_job(run_at=now), now)
    with counting_checkouts(store) as checkouts, store.keeping_connections():
        pids = {backend_pid(store) for _ in range(5)}
        assert sum(len(claim(store, now, limit=2)) for _ in range(5)) == 10
    assert len(pids) == 1
    assert len(checkouts) == 1


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_kept_connection_is_in_autocommit_and_leaves_it_when_given_back(
    store: JobStore,
) -> None:
    states: list[bool] = []

    def checked_in(dbapi: Any, _record: Any) -> None:
        states.append(dbapi.autocommit)

    event.listen(store.engine, "checkin", checked_in)
    try:
        with store.keeping_connections():
            with store.autocommit() as conn:
                dbapi: Any = conn.connection.driver_connection
                assert dbapi.autocommit is True
            assert states == []  # kept, not given back
        assert states == [False]
    finally:
        event.remove(store.engine, "checkin", checked_in)
    assert store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_kept_connection_unused_for_a_while_goes_back_to_the_pool_first(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle worker's claim checks out from the pool, so ``pool_pre_ping`` and
    ``pool_recycle`` still apply to it."""
    monkeypatch.setattr("flask_defer.store.postgres.kept.KEPT_IDLE", 0.0)
    with counting_checkouts(store) as checkouts, store.keeping_connections():
        for _ in range(3):
            backend_pid(store)
    assert len(checkouts) == 3
    assert store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_connection_kept_for_long_goes_back_to_the_pool_even_while_busy(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("flask_defer.store.postgres.kept.KEPT_AT_MOST", 0.0)
    with counting_checkouts(store) as checkouts, store.keeping_connections():
        for _ in range(3):
            backend_pid(store)
    assert len(checkouts) == 3


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_block_that_raises_gives_its_kept_connection_back(store: JobStore) -> None:
    with counting_checkouts(store) as checkouts, store.keeping_connections():
        with pytest.raises(RuntimeError), store.autocommit():
            raise RuntimeError("the handler of the batch failed")
        assert store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        backend_pid(store)
    assert len(checkouts) == 2


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_killed_kept_connection_fails_one_claim_and_the_next_takes_a_new_one(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    """A server restart or an idle timeout: the worker's loop retries a failed claim;
    the retry must not find the dead connection again."""
    job_id = insert(store, new_job(run_at=now), now)
    with store.keeping_connections():
        with store.autocommit() as conn:
            kill_server_side(conn)
        with pytest.raises(OperationalError) as raised:
            claim(store, now)
        assert raised.value.connection_invalidated
        assert [job.id for job in claim(store, now)] == [job_id]
    assert store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_block_inside_a_kept_block_and_other_threads_use_the_pool(
    store: JobStore,
) -> None:
    other: list[int] = []
    with store.keeping_connections():
        kept = backend_pid(store)
        with store.autocommit() as outer:
            assert outer.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() == kept
            assert backend_pid(store) != kept  # nested: another connection
            thread = threading.Thread(target=lambda: other.append(backend_pid(store)))
            thread.start()
            thread.join()
        assert backend_pid(store) == kept
    assert other and other[0] != kept
    assert store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_thread_that_does_not_keep_gives_each_connection_back(store: JobStore) -> None:
    with counting_checkouts(store) as checkouts:
        for _ in range(3):
            backend_pid(store)
            assert store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert len(checkouts) == 3


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_keeping_block_inside_another_leaves_the_connection_to_the_outer_one(
    store: JobStore,
) -> None:
    with counting_checkouts(store) as checkouts, store.keeping_connections():
        first = backend_pid(store)
        with store.keeping_connections():
            assert backend_pid(store) == first
        assert backend_pid(store) == first
        assert store.engine.pool.checkedout() == 1  # type: ignore[attr-defined]
    assert len(checkouts) == 1
    assert store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_watched_engine_is_not_kept_and_asks_only_once_per_keeping_block(
    store: JobStore,
) -> None:
    """A watched engine's autocommit is SQLAlchemy's, never kept: one checkout per
    block, plus the one that found it so."""

    def watch(*_args: Any) -> None:
        pass

    event.listen(store.engine, "before_cursor_execute", watch)
    try:
        with counting_checkouts(store) as checkouts, store.keeping_connections():
            pids = [backend_pid(store) for _ in range(3)]
            assert store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    finally:
        event.remove(store.engine, "before_cursor_execute", watch)
    assert len(pids) == 3
    assert len(checkouts) == 4
