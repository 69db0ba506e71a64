"""The claim's queue controls on a bare store, both backends: priority, expiry and
per-key concurrency limits, and "when is the next claimable job due"."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import MetaData, create_engine, event, select
from sqlalchemy.exc import DataError, OperationalError

from flask_defer.errors import NotConfigured
from flask_defer.jobs import Job, JobStatus
from flask_defer.store import JobFilter, JobStore, NewJob
from flask_defer.store.schema import define_history_table, define_jobs_table

from ..pg_databases import kill_server_side

MakeJob = Callable[..., NewJob]


def insert(store: JobStore, job: NewJob, now: datetime) -> int:
    with store.begin() as conn:
        return store.insert(conn, job, now=now, replace=False).id


def claim(store: JobStore, now: datetime, limit: int = 10, **kw: object) -> list[Job]:
    lease = now + timedelta(minutes=1)
    return store.claim(now=now, limit=limit, token=uuid.uuid4().hex, lease_until=lease, **kw)  # type: ignore[arg-type]


def done(store: JobStore, job: Job, now: datetime) -> None:
    assert store.ack_done(job, now=now)


# -- priority ------------------------------------------------------------------------


def test_a_claim_takes_the_most_urgent_priority_first_then_run_at(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    ago = [now - timedelta(seconds=s) for s in range(10)]
    late_low = insert(store, new_job(priority=5, run_at=ago[9]), now)
    urgent_newer = insert(store, new_job(priority=-3, run_at=ago[1]), now)
    urgent_older = insert(store, new_job(priority=-3, run_at=ago[2]), now)
    normal = insert(store, new_job(run_at=ago[5]), now)
    order = [job.id for job in claim(store, now, limit=1)]
    order += [job.id for job in claim(store, now, limit=1)]
    order += [job.id for job in claim(store, now, limit=1)]
    order += [job.id for job in claim(store, now, limit=1)]
    assert order == [urgent_older, urgent_newer, normal, late_low]


def test_one_claim_takes_the_due_jobs_of_one_priority(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    urgent = {insert(store, new_job(priority=-1, run_at=now), now) for _ in range(3)}
    rest = {insert(store, new_job(run_at=now), now) for _ in range(3)}
    assert {job.id for job in claim(store, now)} == urgent
    assert {job.id for job in claim(store, now)} == rest


def test_future_jobs_of_an_urgent_priority_do_not_hold_back_due_jobs_of_another(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    # Thousands of reminders due next month at a more urgent priority: the claim steps
    # over their priority (its first row is not due) instead of reading them all.
    later = now + timedelta(days=30)
    with store.begin() as conn:
        store.insert_many(
            conn, [new_job(priority=-50, run_at=later) for _ in range(2000)], now=now
        )
    due = insert(store, new_job(priority=10, run_at=now), now)
    assert [job.id for job in claim(store, now)] == [due]
    assert store.next_run_at(now=now) == later


def test_bulk_inserts_keep_priority_and_expiry(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    expires = now + timedelta(minutes=5)
    with store.begin() as conn:
        store.insert_many(conn, [new_job(priority=7, expires_at=expires)] * 2, now=now)
    with store.begin() as conn:
        jobs = store.find(conn, JobFilter(), limit=10)
    assert [(job.priority, job.expires_at) for job in jobs] == [(7, expires)] * 2


# -- expiry --------------------------------------------------------------------------


def test_a_job_past_its_expiry_is_never_claimed_and_the_sweep_settles_it_as_expired(
    engine: object, new_job: MakeJob, now: datetime
) -> None:
    metadata = MetaData()
    table = define_jobs_table(metadata)
    store = JobStore(engine, table, define_history_table(metadata))  # type: ignore[arg-type]
    store.create_table()
    stale = insert(store, new_job(run_at=now - timedelta(minutes=2), expires_at=now), now)
    fresh = insert(store, new_job(run_at=now, expires_at=now + timedelta(seconds=1)), now)
    assert store.next_run_at(now=now) == now
    assert [job.id for job in claim(store, now)] == [fresh]
    assert store.next_run_at(now=now) is None  # the stale one is not waiting to run
    assert store.expire_due(now=now, actor="worker:test") == 1
    assert store.expire_due(now=now) == 0  # guarded: settled once
    with store.begin() as conn:
        job = store.get(conn, job_id=stale)
        events = store.history(conn, stale)
    assert job is not None and job.status is JobStatus.EXPIRED and job.finished_at == now
    found = [(e.event, e.actor) for e in events]
    assert found == [("scheduled", "app"), ("expired", "worker:test")]


def test_the_sweep_leaves_running_jobs_and_jobs_without_expiry(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    running = insert(store, new_job(run_at=now, expires_at=now + timedelta(seconds=1)), now)
    plain = insert(store, new_job(run_at=now - timedelta(days=1)), now)
    assert [job.id for job in claim(store, now, limit=1)] == [plain]
    assert [job.id for job in claim(store, now, limit=1)] == [running]
    assert store.expire_due(now=now + timedelta(hours=1)) == 0


# -- per-key concurrency -------------------------------------------------------------


def test_at_most_the_limit_of_one_key_run_at_once(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    ids = [
        insert(store, new_job(run_at=now - timedelta(seconds=n), concurrency_key="acct:1",
                              concurrency_limit=2), now)
        for n in range(5)
    ]  # fmt: skip
    other = insert(store, new_job(run_at=now, concurrency_key="acct:2", concurrency_limit=2), now)
    first = claim(store, now)
    assert {job.id for job in first} == {ids[4], ids[3], other}
    assert claim(store, now) == []  # acct:1 has both its slots taken
    done(store, next(job for job in first if job.id == ids[4]), now)
    assert [job.id for job in claim(store, now)] == [ids[2]]


def test_a_job_of_a_key_waiting_for_a_slot_keeps_its_place_before_higher_limits(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    """docs/queues.md: a key's due jobs ahead of a job count against its own limit, so
    a limit-2 job waits behind a limit-1 job that waits behind a running one (1 + 1 + 1
    > 2), and a limit-5 job does not (1 + 3 <= 5)."""

    def keyed(seconds_ago: int, limit: int) -> int:
        when = now - timedelta(seconds=seconds_ago)
        job = new_job(run_at=when, concurrency_key="k", concurrency_limit=limit)
        return insert(store, job, now)

    first, waiting, later = keyed(30, 1), keyed(20, 1), keyed(10, 2)
    (running,) = claim(store, now, limit=1)
    assert running.id == first
    assert claim(store, now) == []  # neither may start beside the running one
    roomy = keyed(5, 5)
    (started,) = claim(store, now)
    assert started.id == roomy
    done(store, running, now)
    done(store, started, now)
    assert {job.id for job in claim(store, now)} == {waiting, later}


def test_a_key_at_its_limit_does_not_count_as_due_for_the_next_look(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    for _ in range(2):
        insert(store, new_job(run_at=now, concurrency_key="tenant:9"), now)
    later = now + timedelta(seconds=30)
    insert(store, new_job(run_at=later), now)
    (running,) = claim(store, now)
    assert running.concurrency_limit is None  # the store counts no limit as 1
    assert store.next_run_at(now=now) == later  # the second tenant:9 job must wait
    done(store, running, now)
    assert store.next_run_at(now=now) == now


def test_keyed_jobs_are_not_starved_by_a_backlog_of_unkeyed_jobs(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    with store.begin() as conn:
        store.insert_many(conn, [new_job(run_at=now - timedelta(minutes=1))] * 50, now=now)
    keyed = insert(store, new_job(run_at=now, concurrency_key="k"), now)
    assert keyed in {job.id for job in claim(store, now, limit=5)}


def test_a_fresh_store_finds_keyed_jobs_another_process_scheduled(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    keyed = insert(store, new_job(run_at=now, concurrency_key="k"), now)
    other_process = JobStore(store.engine, define_jobs_table(MetaData()))
    assert other_process.next_run_at(now=now) == now
    assert [job.id for job in claim(other_process, now)] == [keyed]


@pytest.mark.parametrize("backend", ["postgresql"])
def test_claims_racing_from_many_processes_never_exceed_a_keys_limit(
    store: JobStore, new_job: MakeJob, now: datetime, database_url: str
) -> None:
    """Eight stores (as eight worker processes would) claim one key's jobs at once."""
    with store.begin() as conn:
        for _ in range(40):
            store.insert(conn, new_job(run_at=now, concurrency_key="hot"), now=now, replace=False)
    engines = [create_engine(database_url) for _ in range(8)]
    stores = [JobStore(e, define_jobs_table(MetaData())) for e in engines]
    start = threading.Barrier(len(stores))
    claimed: list[list[Job]] = []
    lock = threading.Lock()

    def race(racer: JobStore) -> None:
        start.wait()
        for _ in range(5):
            got = claim(racer, now)
            with lock:
                claimed.append(got)

    threads = [threading.Thread(target=race, args=(racer,)) for racer in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for engine in engines:
        engine.dispose()
    assert sum(len(batch) for batch in claimed) == 1
    t = store.table
    with store.engine.connect() as conn:
        running = conn.execute(select(t.c.id).where(t.c.status == "running")).all()
    assert len(running) == 1


# -- PostgreSQL: the claim runs on psycopg's cursor, errors stay SQLAlchemy's -----------


def _claim_params(now: datetime, **overrides: object) -> dict[str, object]:
    lease = now + timedelta(minutes=1)
    params = {"now": now, "limit": 5, "token": "t", "lease_until": lease, "actor": "w"}
    return {**params, **overrides}


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_claim_on_a_killed_connection_invalidates_it_and_the_next_claim_reconnects(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    job_id = insert(store, new_job(run_at=now), now)
    with store.autocommit() as conn:
        kill_server_side(conn)
        with pytest.raises(OperationalError) as raised:
            store.driver._run_claim(conn, "due", False, _claim_params(now))  # type: ignore[attr-defined]
        assert raised.value.connection_invalidated and conn.invalidated
    # The pool never hands the dead connection out again: the next claim takes the job.
    assert [job.id for job in claim(store, now)] == [job_id]


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_failing_claim_raises_sqlalchemys_error_and_keeps_its_connection(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    job_id = insert(store, new_job(run_at=now), now)
    with store.autocommit() as conn:
        with pytest.raises(DataError):  # claim_token is VARCHAR(64)
            store.driver._run_claim(conn, "due", False, _claim_params(now, token="x" * 65))  # type: ignore[attr-defined]
        assert not conn.invalidated
        assert conn.exec_driver_sql("SELECT 1").scalar() == 1
    assert [job.id for job in claim(store, now)] == [job_id]


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_claim_whose_prepared_statement_is_lost_names_the_pooler_and_the_fix(
    store: JobStore, now: datetime
) -> None:
    with store.autocommit() as conn:
        for _ in range(8):  # psycopg prepares a statement from its sixth run
            store.driver._run_claim(conn, "due", False, _claim_params(now))  # type: ignore[attr-defined]
        # What a transaction-mode pooler does: the next run lands where the statement
        # was never prepared. Below psycopg, so it still believes it prepared.
        driver: Any = conn.connection.driver_connection
        driver.pgconn.exec_(b"DEALLOCATE ALL")
        with pytest.raises(NotConfigured) as raised:
            store.driver._run_claim(conn, "due", False, _claim_params(now))  # type: ignore[attr-defined]
    message = str(raised.value)
    assert "transaction-mode pooler" in message and "prepare_threshold" in message


@pytest.mark.parametrize("when", ["before_cursor_execute", "after_cursor_execute"])
def test_a_claim_on_a_watched_engine_is_seen_by_its_cursor_listeners(
    store: JobStore, new_job: MakeJob, now: datetime, when: str
) -> None:
    """SQL logging and tracing instrumentation listen to cursor executions: the claim
    runs past SQLAlchemy's execution, which they would not see, so on a watched engine
    it does not (on SQLite the write lock's own listener does not count as watching)."""
    seen: list[str] = []

    def watch(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    job_id = insert(store, new_job(run_at=now), now)
    event.listen(store.engine, when, watch)
    try:
        claimed = claim(store, now)
    finally:
        event.remove(store.engine, when, watch)
    assert [job.id for job in claimed] == [job_id]
    claims = [sql for sql in seen if "UPDATE" in sql and "RETURNING" in sql]
    assert len(claims) == 1 and "'running'" in claims[0]


# -- connections ---------------------------------------------------------------------


def test_a_claim_that_remembers_no_keyed_jobs_checks_out_one_connection(
    store: JobStore, new_job: MakeJob, now: datetime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look for keyed jobs is remembered for a moment; a claim within it opens no
    connection for that look, only the one that claims."""
    # The moment made long, so that a slow host cannot let it lapse between the claims.
    monkeypatch.setattr("flask_defer.store.claims.KEYED_UNSEEN", 60.0)
    insert(store, new_job(run_at=now), now)
    insert(store, new_job(run_at=now), now)
    assert len(claim(store, now, limit=1)) == 1  # looks, and remembers "none"
    checkouts: list[object] = []

    def checked_out(*args: Any) -> None:
        checkouts.append(args)

    event.listen(store.engine, "checkout", checked_out)
    try:
        assert store.keyed_remembered() is False
        # Without SQLite's look before the write lock, which has a connection of its own.
        assert len(claim(store, now, limit=1, look_first=False)) == 1
    finally:
        event.remove(store.engine, "checkout", checked_out)
    assert len(checkouts) == 1


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_connection_leaves_autocommit_before_the_pool_has_it_again(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    """The claim and the acknowledgement switch their connection to autocommit; the
    app's next transaction on it (from the same pool) must be a transaction again."""
    states: list[bool] = []

    def checked_in(dbapi: Any, _record: Any) -> None:
        states.append(dbapi.autocommit)

    event.listen(store.engine, "checkin", checked_in)
    try:
        with store.autocommit() as conn:
            dbapi: Any = conn.connection.driver_connection
            assert dbapi.autocommit is True
            insert(store, new_job(run_at=now), now)  # another connection, meanwhile
        assert states and states[-1] is False
        # Every pooled connection, this one among them, rolls back what it wrote.
        with store.engine.connect() as conn:
            table = store.table
            conn.execute(table.delete())
            conn.rollback()
            assert conn.execute(select(table.c.id)).all()
    finally:
        event.remove(store.engine, "checkin", checked_in)
    assert all(state is False for state in states)


@pytest.mark.parametrize("backend", ["postgresql"])
def test_autocommit_on_a_watched_engine_is_sqlalchemys_so_its_log_says_so(
    store: JobStore,
) -> None:
    """Switched on psycopg's connection, SQLAlchemy would log "BEGIN (implicit)" and
    "ROLLBACK" around statements that commit on their own: a watched engine (SQL
    logging, tracing) gets SQLAlchemy's own autocommit instead."""
    with store.autocommit() as conn:
        assert conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT"

    def watch(*_args: Any) -> None:
        pass

    event.listen(store.engine, "after_cursor_execute", watch)
    try:
        with store.autocommit() as conn:
            assert conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
            assert conn.connection.driver_connection.autocommit is True  # type: ignore[union-attr]
    finally:
        event.remove(store.engine, "after_cursor_execute", watch)


@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize("column, text", [("payload", "'{not json'"), ("created_at", "5"),
                                          ("created_at", "'yesterday'")])  # fmt: skip
def test_a_claimed_row_that_cannot_be_read_fails_alone_and_the_claim_goes_on(
    store: JobStore, new_job: Callable[..., NewJob], now: datetime, column: str, text: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SQLite keeps JSON and times as text, which a hand-written UPDATE can make
    unreadable (PostgreSQL's typed columns refuse it). The claim fails that job on its
    own, with the reason, logged, and returns the others: it does not raise and leave
    them running for a lease with their attempts spent, claim after claim."""
    bad = insert(store, new_job(run_at=now), now)
    good = insert(store, new_job(run_at=now), now)
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE {store.table.name} SET {column} = {text} WHERE id = {bad}")

    with caplog.at_level("ERROR", logger="flask_defer"):
        claimed = claim(store, now, limit=2)

    assert [job.id for job in claimed] == [good]
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(store.table.c.id, store.table.c.status, store.table.c.attempts,
                   store.table.c.last_error, store.table.c.claim_token)
            .order_by(store.table.c.id)
        ).all()  # fmt: skip
    (bad_row, good_row) = rows
    assert tuple(bad_row)[:3] == (bad, "failed", 1)
    assert bad_row.last_error.startswith(f"its row could not be read ({column}): ")
    assert bad_row.claim_token is None
    assert tuple(good_row)[:3] == (good, "running", 1)
    assert f"job {bad} failed without running" in caplog.text
    assert claim(store, now, limit=2) == []  # nothing left to take, nothing raised


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_keyed_row_that_cannot_be_read_fails_alone_and_frees_its_key(
    history_store: JobStore, new_job: Callable[..., NewJob], now: datetime,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The keyed claim builds its jobs inside its transaction (for the rate limits),
    where an unreadable row used to raise and roll the whole claim back: every claim
    after it did the same, so one spoilt keyed row stopped every job of the worker.
    It fails alone now and, as it never ran, takes none of its rate limit's starts:
    the next job of its key (one start a minute) runs at the next claim."""
    store = history_store
    rated = {"concurrency_key": "k", "rate_limit": 1, "rate_period": 60.0}
    bad = insert(store, new_job(run_at=now - timedelta(seconds=2), **rated), now)
    same_key = insert(store, new_job(run_at=now - timedelta(seconds=1), **rated), now)
    other_key = insert(store, new_job(run_at=now, concurrency_key="j"), now)
    plain = insert(store, new_job(run_at=now), now)
    with store.engine.begin() as conn:
        conn.exec_driver_sql(
            f"UPDATE {store.table.name} SET payload = '{{not json' WHERE id = {bad}"
        )

    with caplog.at_level("ERROR", logger="flask_defer"):
        claimed = claim(store, now, limit=10)

    assert sorted(job.id for job in claimed) == [other_key, plain]
    assert f"job {bad} failed without running" in caplog.text
    with store.engine.connect() as conn:
        bad_row = conn.execute(
            select(store.table.c.status, store.table.c.attempts, store.table.c.last_error)
            .where(store.table.c.id == bad)
        ).one()  # fmt: skip
        counted = conn.execute(select(store.starts_table.c.bucket)).scalars().all()
    assert tuple(bad_row)[:2] == ("failed", 1)
    assert bad_row.last_error.startswith("its row could not be read (payload): ")
    assert counted == []
    assert [job.id for job in claim(store, now)] == [same_key]
    with store.engine.connect() as conn:
        assert conn.execute(select(store.starts_table.c.bucket)).scalars().all() == ["k"]
    with store.engine.connect() as conn:
        events = [(e.event, e.attempt) for e in store.history(conn, bad)]
    assert events == [("scheduled", 0), ("started", 1), ("failed", 1)]


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_claim_whose_failing_of_an_unreadable_row_raises_still_returns_the_others(
    store: JobStore, new_job: Callable[..., NewJob], now: datetime,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """The unreadable row is failed after the claim committed; should that write fail
    (the database locked, say), the claim does not raise, since its readable jobs are
    claimed and must start: the row stays running and comes back after its lease."""
    bad = insert(store, new_job(run_at=now), now)
    good = insert(store, new_job(run_at=now), now)
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE {store.table.name} SET payload = '{{x' WHERE id = {bad}")

    def locked(*_args: Any, **_options: Any) -> set[int]:
        raise OperationalError("UPDATE", {}, Exception("database is locked"))

    monkeypatch.setattr(store.driver, "acknowledge_many", locked)
    with caplog.at_level("ERROR", logger="flask_defer"):
        claimed = claim(store, now, limit=2)

    assert [job.id for job in claimed] == [good]
    assert "could not fail 1 job(s) whose rows cannot be read (database is locked)" in (
        caplog.text
    )
    with store.engine.connect() as conn:
        status = conn.execute(
            select(store.table.c.status).where(store.table.c.id == bad)
        ).scalar_one()  # fmt: skip
    assert status == "running"
