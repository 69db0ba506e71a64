"""The store's worker-side additions, on a bare engine: the indexed poll, the lock-free
idle claim, the maintenance lock, unknown-handler counting and NOTIFY on reschedule."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData, event, text, update

from flask_defer.jobs import Job, JobStatus
from flask_defer.store import UNKNOWN_HANDLER_NOTE, Ack, JobStore, NewJob
from flask_defer.store import postgres as postgres_driver
from flask_defer.store import sqlite as sqlite_driver
from flask_defer.store.schema import define_jobs_table

MakeJob = Callable[..., NewJob]


def insert(store: JobStore, job: NewJob, now: datetime) -> int:
    with store.begin() as conn:
        return store.insert(conn, job, now=now, replace=False).id


def plan(store: JobStore, stmt: Any, **params: Any) -> str:
    compiled = stmt.bindparams(**params).compile(
        store.engine, compile_kwargs={"render_postcompile": True}
    )
    values = tuple(compiled.params[name] for name in compiled.positiontup)
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + str(compiled), values).all()
    return " / ".join(row[3] for row in rows)


def driver_plan(store: JobStore, sql: str, **params: Any) -> str:
    """SQLite's plan of a claim text the driver runs itself (values bound as stored)."""
    stored = {
        name: json.dumps(value) if name == "queues" else store.driver.stored_time(value)
        if isinstance(value, datetime) else value
        for name, value in params.items()
    }  # fmt: skip
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, stored).all()
    return " / ".join(row[3] for row in rows)


@pytest.mark.parametrize("backend", ["sqlite"])
def test_sqlite_poll_and_claim_step_into_the_priority_index_never_scanning_the_table(
    store: JobStore, now: datetime
) -> None:
    claim_params = {"now": now, "limit": 10, "token": "t", "lease_until": now}
    sql = store.driver._claim_statement("due", True)[0]
    claim = driver_plan(store, sql, queues=["default"], **claim_params)
    poll = plan(store, store._next_statement("next", True), now=now, queues=["default"])
    for found in (claim, poll):
        assert "ix_defer_jobs_pending_priority (priority=?" in found, found
        assert "SCAN defer_jobs /" not in found + " /", found
    # The claim takes the chosen priority's due rows in index order: no sort.
    assert "TEMP B-TREE" not in claim
    keyed = driver_plan(store, store.driver._claim_statement("keyed", False)[0], **claim_params)
    assert "ix_defer_jobs_keyed_pending" in keyed


def test_next_run_at_and_claim_respect_queues(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    insert(store, new_job(queue="mail", run_at=now + timedelta(seconds=5)), now)
    insert(store, new_job(queue="reports", run_at=now + timedelta(seconds=1)), now)
    assert store.next_run_at() == now + timedelta(seconds=1)
    assert store.next_run_at(queues=["mail"]) == now + timedelta(seconds=5)
    later = now + timedelta(seconds=10)
    token = uuid.uuid4().hex
    claimed = store.claim(now=later, limit=5, token=token, lease_until=later, queues=["mail"])
    assert [job.queue for job in claimed] == ["mail"]


def test_claim_by_several_queues_takes_jobs_of_each_and_no_other(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    for queue in ("mail", "reports", "billing", "mail"):
        insert(store, new_job(queue=queue, run_at=now - timedelta(seconds=1)), now)
    queues = ["mail", "reports"]
    claimed = store.claim(now=now, limit=10, token="t", lease_until=now, queues=queues)
    assert sorted(job.queue for job in claimed) == ["mail", "mail", "reports"]
    # Another set of queues reuses nothing of the first claim's answer.
    rest = store.claim(now=now, limit=10, token="u", lease_until=now, queues=["billing"])
    assert [job.queue for job in rest] == ["billing"]


@pytest.mark.parametrize("backend", ["postgresql"])
def test_postgresql_claim_keeps_one_plan_that_scans_no_table(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    """PostgreSQL plans a prepared claim once (its generic plan) only if that plan is as
    cheap as the ones it makes for the values: with a backlog of due jobs, the plan
    made without knowing the limit hashed a scan of the whole table to start the
    claimed rows (measured: 2.2 against 0.65 ms a claim of 20 from 20,000 due). The
    claim's generic plan must reach every row through an index."""
    with store.begin() as conn:
        due = [new_job(run_at=now - timedelta(minutes=1)) for _ in range(20_000)]
        store.insert_many(conn, due, now=now)
    sql, _build = store.driver._claim_statement("due", False, 20)
    values = {"now": now, "token": "u", "lease_until": now, "actor": "w", "limit": 20}
    with store.engine.connect() as conn:
        conn.exec_driver_sql("ANALYZE defer_jobs")
        conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
        cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, values)
        plan = cursor.fetchone()[0]
        conn.rollback()

    def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node] + [n for child in node.get("Plans", []) for n in nodes(child)]

    scans = [n for n in nodes(plan[0]["Plan"]) if n.get("Relation Name") == "defer_jobs"]
    assert scans and all(n["Node Type"] != "Seq Scan" for n in scans), scans
    assert len(store.claim(now=now, limit=20, token="u", lease_until=now)) == 20


def test_a_claimed_job_is_the_row_as_get_reads_it_in_utc_whatever_the_session_zone(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    """PostgreSQL's claim reads its rows through the driver, not SQLAlchemy's types: the
    job must still be exactly what ``get`` returns, every timestamp aware UTC, the payload
    parsed, even when the connection's time zone is not UTC."""
    if store.driver.name == "postgresql":

        @event.listens_for(store.engine, "connect")
        def _zone(dbapi_connection: Any, _record: Any) -> None:
            with dbapi_connection.cursor() as cursor:
                cursor.execute("SET TIME ZONE 'Asia/Kathmandu'")
            dbapi_connection.commit()

        store.engine.dispose()
    payload = {"to": ["a@example.com"], "n": 7, "deep": {"ok": True, "x": None}}
    job_id = insert(
        store,
        new_job(
            payload=payload,
            key="message:7",
            priority=-3,
            expires_at=now + timedelta(hours=1),
            run_at=now - timedelta(seconds=2),
        ),
        now,
    )
    lease = now + timedelta(minutes=1)
    [claimed] = store.claim(now=now, limit=5, token="me", lease_until=lease, actor="w")
    with store.engine.connect() as conn:
        read = store.get(conn, job_id=job_id)
    assert read is not None
    assert claimed == read
    assert claimed.payload == payload and claimed.status is JobStatus.RUNNING
    assert (claimed.attempts, claimed.claim_token, claimed.lease_expires_at) == (1, "me", lease)
    stamps = [claimed.run_at, claimed.due_at, claimed.created_at, claimed.updated_at]
    stamps += [claimed.expires_at, claimed.lease_expires_at]
    assert all(stamp is not None and stamp.utcoffset() == timedelta(0) for stamp in stamps)
    assert claimed.run_at == now - timedelta(seconds=2)


@pytest.mark.parametrize("backend", ["sqlite"])
def test_idle_claim_on_sqlite_does_not_wait_for_the_write_lock(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    # A web request holds the write lock; a worker finding nothing due must not queue
    # behind it (nor make the request queue behind the worker).
    insert(store, new_job(run_at=now + timedelta(hours=1)), now)
    with store.engine.connect() as writer:
        writer.exec_driver_sql("BEGIN IMMEDIATE")
        started = time.monotonic()
        assert store.claim(now=now, limit=5, token="t", lease_until=now) == []
        assert time.monotonic() - started < 1.0
        writer.rollback()


def test_claim_still_takes_only_due_jobs_in_order_with_a_fresh_table(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    ids = [insert(store, new_job(run_at=now - timedelta(seconds=n)), now) for n in range(5)]
    insert(store, new_job(run_at=now + timedelta(seconds=1)), now)
    claimed = store.claim(now=now, limit=3, token="t", lease_until=now)
    assert [job.id for job in claimed] == list(reversed(ids))[:3]
    assert all(job.attempts == 1 and job.claim_token == "t" for job in claimed)


def test_missing_pending_index_falls_back_to_a_plain_query(
    engine: Engine, new_job: MakeJob, now: datetime, caplog: pytest.LogCaptureFixture
) -> None:
    # A database migrated by hand without the partial index keeps working.
    from sqlalchemy import MetaData

    store = JobStore(engine, define_jobs_table(MetaData()))
    store.create_table()
    with store.begin() as conn:
        conn.execute(text("DROP INDEX ix_defer_jobs_pending_priority"))
    insert(store, new_job(run_at=now), now)
    with caplog.at_level(logging.WARNING, logger="flask_defer"):
        assert store.next_run_at(now=now) == now
        assert len(store.claim(now=now, limit=5, token="t", lease_until=now)) == 1
    if store.driver.name == "sqlite":
        assert "falling back to unhinted queries" in caplog.text


def test_a_claim_meeting_the_missing_pending_index_first_falls_back_too(
    engine: Engine, new_job: MakeJob, now: datetime
) -> None:
    """The claim runs past SQLAlchemy's execution; its error must still be SQLAlchemy's
    for the store to recognise the lost index and fall back."""
    from sqlalchemy import MetaData

    store = JobStore(engine, define_jobs_table(MetaData()))
    store.create_table()
    with store.begin() as conn:
        conn.execute(text("DROP INDEX ix_defer_jobs_pending_priority"))
    job_id = insert(store, new_job(run_at=now), now)
    claimed = store.claim(now=now, limit=5, token="t", lease_until=now, look_first=False)
    assert [job.id for job in claimed] == [job_id]


def test_maintenance_lock_admits_one_worker_at_a_time(store: JobStore, backend: str) -> None:
    entered = threading.Event()
    leave = threading.Event()
    results: list[bool] = []

    def hold() -> None:
        with store.maintenance_lock() as mine:
            results.append(mine)
            entered.set()
            leave.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert entered.wait(10)
    with store.maintenance_lock() as second:
        pass
    leave.set()
    holder.join(10)
    with store.maintenance_lock() as after:
        pass
    assert results == [True]
    # SQLite has a single writer anyway: every worker may do maintenance.
    assert second is (backend == "sqlite")
    assert after is True


def test_count_unknown_includes_jobs_a_worker_could_not_run(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    known = insert(store, new_job(name="send_email"), now)  # known here ...
    insert(store, new_job(name="old_name", run_at=now + timedelta(seconds=1)), now)
    [claimed] = store.claim(now=now, limit=1, token="t", lease_until=now)
    assert claimed.id == known
    # ... but not to the worker, which left this note.
    store.ack_snooze(
        claimed,
        now=now,
        run_at=now + timedelta(seconds=30),
        note=f"{UNKNOWN_HANDLER_NOTE} for 'send_email' in the worker",
        still_owed=True,
    )
    with store.begin() as conn:
        assert store.count_unknown(conn, {"send_email"}) == 2
        assert store.count_unknown(conn, {"send_email", "old_name"}) == 1


@pytest.mark.parametrize("backend", ["postgresql"])
def test_reschedule_notifies_listeners(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    # "Run now" from the dashboard must not wait for a worker's timed wake.
    from flask_defer.engine.wake import Wake, Waker

    job_id = insert(store, new_job(run_at=now + timedelta(hours=1)), now)
    waker = Waker(store.open_listener)
    waker.start()
    try:
        with store.begin() as conn:
            assert store.reschedule(conn, now, now=now, job_id=job_id) is not None
        assert waker.wait(5) is Wake.NOTIFY
    finally:
        waker.close()


@pytest.mark.parametrize("backend", ["postgresql"])
def test_insert_notifies_only_jobs_due_within_a_workers_longest_sleep(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    # A sleeping worker looks at the earliest run_at at least every notify_horizon, so
    # a job due later is found in time without a wake-up; one due sooner must wake it.
    from flask_defer.engine.wake import Wake, Waker

    store.notify_horizon = timedelta(seconds=10)
    waker = Waker(store.open_listener)
    waker.start()
    try:
        insert(store, new_job(run_at=now + timedelta(minutes=5)), now)
        insert(store, new_job(key="later", run_at=now + timedelta(minutes=5)), now)
        assert waker.wait(0.5) is not Wake.NOTIFY
        insert(store, new_job(run_at=now + timedelta(seconds=3)), now)
        assert waker.wait(5) is Wake.NOTIFY
        insert(store, new_job(key="soon", run_at=now + timedelta(seconds=3)), now)
        assert waker.wait(5) is Wake.NOTIFY
    finally:
        waker.close()


# -- batched acknowledgements ---------------------------------------------------------


def _get(store: JobStore, job_id: int) -> Job:
    with store.begin() as conn:
        job = store.get(conn, job_id=job_id)
    assert job is not None
    return job


def test_a_batched_ack_writes_each_outcome_as_a_single_ack_would(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    ids = [insert(store, new_job(max_attempts=3), now) for _ in range(4)]
    jobs = store.claim(now=now, limit=4, token="me", lease_until=now + timedelta(minutes=1))
    assert [job.id for job in jobs] == ids
    later = now + timedelta(seconds=2)
    retry_at = now + timedelta(minutes=5)
    acks = [
        Ack(ids[0], "me", "done", result={"sent": True}),
        Ack(ids[1], "me", "pending", run_at=retry_at, last_error="boom"),
        Ack(ids[2], "me", "failed", last_error="gave up"),
        Ack(ids[3], "me", "pending", run_at=retry_at, due_at=retry_at, attempts_delta=-1),
    ]
    assert store.acknowledge_many(acks, now=later) == set(ids)
    done, retried, failed, snoozed = (_get(store, i) for i in ids)
    assert done.status is JobStatus.DONE and done.result == {"sent": True}
    assert done.finished_at == later and done.claim_token is None
    assert retried.status is JobStatus.PENDING and retried.run_at == retry_at
    assert retried.due_at == now and retried.attempts == 1 and retried.last_error == "boom"
    assert retried.finished_at is None and retried.lease_expires_at is None
    assert failed.status is JobStatus.FAILED and failed.last_error == "gave up"
    assert failed.finished_at == later
    assert snoozed.status is JobStatus.PENDING and snoozed.attempts == 0
    assert snoozed.due_at == retry_at and snoozed.last_error is None
    assert all(job.updated_at == later for job in (done, retried, failed, snoozed))


def test_a_batched_ack_stores_results_and_errors_exactly_as_given(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    """The batch's values reach the row unchanged, whatever they hold (on SQLite they
    travel inside one JSON array)."""
    ids = [insert(store, new_job(max_attempts=3), now) for _ in range(3)]
    store.claim(now=now, limit=3, token="me", lease_until=now + timedelta(minutes=1))
    result = {
        "quote": 'a "b" \\ c', "emoji": "🎉", "big": 2**62, "small": -(2**62),
        "float": 0.1, "nested": [None, True, {"": []}], "text": "line\nnext\ttab",
    }  # fmt: skip
    error = 'Traceback:\n  File "x.py"\nValueError: ünïcødé \\ "quoted" 🎉'
    acks = [
        Ack(ids[0], "me", "done", result=result),
        Ack(ids[1], "me", "failed", last_error=error),
        Ack(ids[2], "me", "done", result="just a string"),
    ]
    assert store.acknowledge_many(acks, now=now) == set(ids)
    done, failed, plain = (_get(store, i) for i in ids)
    assert done.result == result and done.last_error is None
    assert failed.last_error == error and failed.result is None
    assert plain.result == "just a string"


def test_a_batched_ack_stores_a_none_result_as_json_null_and_leaves_other_rows_result(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    """A handler that returns nothing is stored as JSON ``null`` (the text the column
    has always held for it); a retry or a failure leaves the row's result alone."""
    ids = [insert(store, new_job(max_attempts=3), now) for _ in range(3)]
    store.claim(now=now, limit=3, token="me", lease_until=now + timedelta(minutes=1))
    acks = [
        Ack(ids[0], "me", "done", result=None),
        Ack(ids[1], "me", "pending", run_at=now, result={"ignored": True}),
        Ack(ids[2], "me", "failed", last_error="no", result={"ignored": True}),
    ]
    assert store.acknowledge_many(acks, now=now) == set(ids)
    with store.engine.connect() as conn:
        stored = dict(
            conn.execute(
                text("SELECT id, CAST(result AS TEXT) FROM defer_jobs WHERE id IN (:a, :b, :c)"),
                {"a": ids[0], "b": ids[1], "c": ids[2]},
            ).all()
        )
    assert stored == {ids[0]: "null", ids[1]: None, ids[2]: None}


@pytest.mark.parametrize(
    "result", [None, 0, "é 🎉", [1, None], {"b": 1, "a": [True, 0.1]}, 2**62]
)
def test_an_acks_result_json_is_what_json_dumps_writes(result: Any) -> None:
    assert Ack(1, "t", "done", result=result).result_json() == json.dumps(
        result, allow_nan=False
    )
    assert Ack(1, "t", "failed", result=result).result_json() is None


def test_an_acks_result_json_refuses_nan_as_json_dumps_does() -> None:
    with pytest.raises(ValueError, match="JSON compliant"):
        Ack(1, "t", "done", result={"x": float("nan")}).result_json()


@pytest.mark.parametrize("backend", ["sqlite"])
def test_sqlite_batch_ack_looks_each_row_up_by_its_key_never_scanning_the_table(
    store: JobStore,
) -> None:
    sql = store.driver._ack_sql()  # type: ignore[union-attr]
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, ("t", "t", "[]")).all()
    steps = [row[3] for row in rows]
    assert any("json_each" in step for step in steps), steps
    assert any("defer_jobs USING INTEGER PRIMARY KEY" in step for step in steps), steps
    assert not any(step.startswith("SCAN defer_jobs") for step in steps), steps


@pytest.mark.parametrize("where", ["schema", "table a"])
def test_a_batched_ack_works_on_a_schema_qualified_table_and_on_any_table_name(
    engine: Engine, new_job: MakeJob, now: datetime, backend: str, where: str
) -> None:
    """The batch's statement names the table as the app does: with its schema (SQLite
    refuses a schema-qualified column in RETURNING), or named like a short alias."""
    if where == "schema":
        metadata = MetaData(schema="main" if backend == "sqlite" else "public")
        table = define_jobs_table(metadata)
    else:
        table = define_jobs_table(MetaData(), "a")
    store = JobStore(engine, table)
    store.create_table()
    ids = [insert(store, new_job(), now) for _ in range(2)]
    store.claim(now=now, limit=2, token="me", lease_until=now + timedelta(minutes=1))
    acks = [Ack(ids[0], "me", "done", result=[1]), Ack(ids[1], "not mine", "done")]
    assert store.acknowledge_many(acks, now=now) == {ids[0]}
    assert _get(store, ids[0]).status is JobStatus.DONE
    assert _get(store, ids[1]).status is JobStatus.RUNNING


@pytest.mark.parametrize("backend", ["sqlite"])
def test_sqlite_batch_ack_of_large_results_goes_in_statements_sqlite_accepts(
    engine: Engine, new_job: MakeJob, now: datetime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Results have no size bound: a batch whose values together pass SQLite's longest
    value (lowered here to 200 kB) is written in several statements, all of it."""

    @event.listens_for(engine, "connect")
    def _small_limit(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 200_000)

    monkeypatch.setattr(sqlite_driver, "BULK_CHUNK_BYTES", 100_000)
    store = JobStore(engine, define_jobs_table(MetaData()))
    store.create_table()
    ids = [insert(store, new_job(), now) for _ in range(10)]
    store.claim(now=now, limit=10, token="me", lease_until=now + timedelta(minutes=1))
    results = [{"n": n, "blob": '"quoted\\" ' * 3_000} for n in range(10)]
    acks = [Ack(i, "me", "done", result=r) for i, r in zip(ids, results, strict=True)]
    assert store.acknowledge_many(acks, now=now) == set(ids)
    assert [_get(store, i).result for i in ids] == results


def test_a_batch_ack_of_large_results_goes_in_several_statements_of_one_transaction(
    store: JobStore, new_job: MakeJob, now: datetime, backend: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Results have no size bound, and the databases refuse one value over 1 GB: a batch
    whose results together pass the budget (lowered here to 100 kB) is written in
    several statements, all of it, and committed once."""
    monkeypatch.setattr(sqlite_driver, "BULK_CHUNK_BYTES", 100_000)
    monkeypatch.setattr(postgres_driver, "ACK_CHUNK_BYTES", 100_000)
    ids = [insert(store, new_job(), now) for _ in range(10)]
    store.claim(now=now, limit=10, token="me", lease_until=now + timedelta(minutes=1))
    results = [{"n": n, "blob": "x" * 30_000} for n in range(10)]
    acks = [Ack(i, "me", "done", result=r) for i, r in zip(ids, results, strict=True)]
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement.split(None, 1)[0].upper())

    commits: list[object] = []

    def committed(conn: Any) -> None:
        commits.append(conn)

    event.listen(store.engine, "before_cursor_execute", seen)
    event.listen(store.engine, "commit", committed)
    try:
        assert store.acknowledge_many(acks, now=now) == set(ids)
    finally:
        event.remove(store.engine, "before_cursor_execute", seen)
        event.remove(store.engine, "commit", committed)
    assert statements.count("UPDATE" if backend == "sqlite" else "WITH") >= 3
    assert len(commits) == 1
    assert [_get(store, i).result for i in ids] == results
    assert store.acknowledge_many(acks[:1], now=now) == set()  # written, not twice


def test_a_lost_claim_inside_a_batch_is_reported_and_keeps_the_new_owner(
    store: JobStore, new_job: MakeJob, now: datetime, backend: str
) -> None:
    ids = [insert(store, new_job(), now) for _ in range(3)]
    store.claim(now=now, limit=3, token="old", lease_until=now + timedelta(seconds=1))
    # The old worker stalls past its lease: one job is reclaimed and taken by another.
    lapsed = now + timedelta(seconds=5)
    with store.begin() as conn:
        conn.execute(
            text("UPDATE defer_jobs SET lease_expires_at = :at WHERE id = :id"),
            {"at": store.driver.stored_time(now) if backend == "sqlite" else now, "id": ids[1]},
        )
    store.reclaim_lapsed(now=lapsed - timedelta(seconds=4, microseconds=1))
    [taken] = store.claim(
        now=lapsed, limit=1, token="new", lease_until=lapsed + timedelta(minutes=1)
    )
    assert taken.id == ids[1]
    owned = store.acknowledge_many(
        [Ack(job_id, "old", "done") for job_id in ids], now=lapsed
    )
    assert owned == {ids[0], ids[2]}
    kept = _get(store, ids[1])
    assert kept.status is JobStatus.RUNNING and kept.claim_token == "new"
    assert store.acknowledge_many([Ack(ids[1], "new", "done")], now=lapsed) == {ids[1]}


@pytest.mark.parametrize("backend", ["postgresql"])
def test_claim_skips_a_row_another_transaction_holds_without_waiting(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    ids = [insert(store, new_job(), now) for _ in range(3)]
    with store.engine.connect() as holder, holder.begin():
        holder.execute(text("SELECT id FROM defer_jobs WHERE id = :id FOR UPDATE"), {"id": ids[0]})
        started = time.monotonic()
        claimed = store.claim(now=now, limit=3, token="t", lease_until=now + timedelta(minutes=1))
        took = time.monotonic() - started
    assert [job.id for job in claimed] == ids[1:]
    assert took < 2.0  # a blocking claim would wait for the holder, which never lets go here


def test_heartbeat_extends_only_rows_this_claim_still_owns(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    ids = [insert(store, new_job(), now) for _ in range(2)]
    mine = store.claim(now=now, limit=2, token="mine", lease_until=now + timedelta(seconds=30))
    with store.begin() as conn:
        conn.execute(
            text("UPDATE defer_jobs SET claim_token = 'theirs' WHERE id = :id"), {"id": ids[1]}
        )
    until = now + timedelta(minutes=10)
    assert store.extend_leases(mine, now=now, lease_until=until) == 1
    assert _get(store, ids[0]).lease_expires_at == until
    assert _get(store, ids[1]).lease_expires_at == now + timedelta(seconds=30)


def test_adopting_a_claim_by_its_token_returns_and_leases_only_the_rows_it_still_owns(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    """A claimer whose claim raised after the commit gets its jobs back by the token it
    sent, leased anew; the reclaim's and another claim's rows stay theirs."""
    ids = [insert(store, new_job(run_at=now - timedelta(seconds=n)), now) for n in range(4)]
    claimed = store.claim(now=now, limit=4, token="lost", lease_until=now + timedelta(seconds=2))
    assert len(claimed) == 4
    with store.begin() as conn:
        conn.execute(  # one row another claim took since, one the worker finished
            text("UPDATE defer_jobs SET claim_token = 'theirs' WHERE id = :id"), {"id": ids[1]}
        )
    assert store.acknowledge_many([Ack(ids[2], "lost", "done")], now=now) == {ids[2]}
    later = now + timedelta(seconds=1)
    until = later + timedelta(seconds=30)

    adopted = store.adopt_claim("lost", now=later, lease_until=until)

    assert sorted(job.id for job in adopted) == [ids[0], ids[3]]
    assert [job.id for job in adopted] == [ids[3], ids[0]]  # in the claim's order
    for job in adopted:
        assert job.status is JobStatus.RUNNING and job.claim_token == "lost"
        assert job.attempts == 1 and job.lease_expires_at == until
        assert job.payload == _get(store, job.id).payload
        assert _get(store, job.id).lease_expires_at == until
    assert _get(store, ids[1]).lease_expires_at == now + timedelta(seconds=2)
    assert _get(store, ids[2]).status is JobStatus.DONE
    assert store.adopt_claim("never-committed", now=later, lease_until=until) == []


def test_acknowledged_before_names_only_acks_whose_own_event_was_written_since_the_claim(
    history_store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    """A batch retried after an error asks which of its refused acks an earlier try
    wrote: the ack's event kind, at its attempt, by the same actor, since the claim."""
    ids = [insert(history_store, new_job(), now) for _ in range(3)]
    claimed = history_store.claim(
        now=now, limit=3, token="t", lease_until=now + timedelta(minutes=1)
    )
    by_id = {job.id: job for job in claimed}
    acks = [Ack(i, "t", "done", attempt=by_id[i].attempts) for i in ids]
    later = now + timedelta(seconds=1)
    assert history_store.acknowledge_many(acks[:2], now=later, actor="w") == set(ids[:2])
    assert history_store.acknowledge_many(acks, now=later, actor="w") == {ids[2]}

    def asked(**changes: Any) -> set[int]:
        claimed_at = changes.pop("claimed_at", now)
        actor = changes.pop("actor", "w")
        retried = [(replace(ack, **changes), claimed_at) for ack in acks[:2]]
        return history_store.acknowledged_before(retried, actor=actor)

    assert asked() == set(ids[:2])
    assert asked(actor="another worker") == set()
    assert asked(attempt=2) == set()  # another attempt's outcome
    assert asked(status="failed") == set()  # another outcome
    assert asked(last_error="lease lapsed") == set()  # a reclaim's, say
    assert asked(run_at=later) == set()  # an earlier snooze of a refunded attempt, say
    assert asked(claimed_at=later + timedelta(seconds=1)) == set()  # before this claim


def test_without_history_acknowledged_before_names_the_acks_whose_rows_they_left(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    """With ``DEFER_HISTORY = False`` the row is the evidence: no claim, and the ack's
    status, attempts, error and ``run_at``, changed since the claim. A reclaim (the
    lease note), a later claim (a token, another attempt) or a retry at another time
    does not pass for it."""
    ids = [insert(store, new_job(), now) for _ in range(3)]
    store.claim(now=now, limit=3, token="t", lease_until=now + timedelta(minutes=1))
    later = now + timedelta(seconds=1)
    retry_at = now + timedelta(minutes=5)
    done, retried, snoozed = (
        Ack(ids[0], "t", "done", attempt=1, result={"n": 1}),
        Ack(ids[1], "t", "pending", run_at=retry_at, last_error="boom", attempt=1),
        Ack(ids[2], "t", "pending", run_at=retry_at, attempts_delta=-1, attempt=1),
    )
    acks = [done, retried, snoozed]
    assert store.acknowledge_many(acks, now=later) == set(ids)

    def asked(ack: Ack, claimed_at: datetime = now, **changes: Any) -> set[int]:
        return store.acknowledged_before([(replace(ack, **changes), claimed_at)])

    assert store.acknowledged_before([(ack, now) for ack in acks]) == set(ids)
    assert asked(done, attempt=2) == set()  # another attempt's outcome
    assert asked(done, status="failed") == set()  # another outcome
    assert asked(retried, last_error="lease lapsed") == set()  # a reclaim's, say
    assert asked(retried, run_at=later) == set()  # a retry at another time
    assert asked(snoozed, attempts_delta=0) == set()  # a retry, not this snooze
    assert asked(done, claimed_at=later + timedelta(seconds=1)) == set()  # before the claim
    with store.begin() as conn:  # claimed again since: a token, another attempt
        conn.execute(
            update(store.table).where(store.table.c.id == ids[1])
            .values(status="running", claim_token="u", attempts=2)
        )  # fmt: skip
    assert asked(retried) == set()


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_batched_ack_writes_the_free_rows_and_waits_for_a_held_one_alone(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    # Waiting for a held row while holding the batch's others could deadlock with the
    # holder; the batch writes the free rows at once and the held one on its own.
    ids = [insert(store, new_job(), now) for _ in range(2)]
    store.claim(now=now, limit=2, token="me", lease_until=now + timedelta(minutes=1))
    answer: list[set[int]] = []
    with store.engine.connect() as holder, holder.begin():
        holder.execute(text("SELECT id FROM defer_jobs WHERE id = :id FOR UPDATE"), {"id": ids[1]})
        flusher = threading.Thread(
            target=lambda: answer.append(
                store.acknowledge_many([Ack(i, "me", "done") for i in ids], now=now)
            )
        )
        flusher.start()
        deadline = time.monotonic() + 10
        while _get(store, ids[0]).status is not JobStatus.DONE:
            assert time.monotonic() < deadline, "the free row waited for the held one"
            time.sleep(0.02)
        assert _get(store, ids[1]).status is JobStatus.RUNNING and not answer
    flusher.join(10)
    assert answer == [set(ids)]
    assert _get(store, ids[1]).status is JobStatus.DONE


def test_a_claim_counts_each_attempt_in_the_claim_itself(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    ids = [insert(store, new_job(max_attempts=3), now) for _ in range(3)]
    lease = now + timedelta(minutes=1)
    jobs = store.claim(now=now, limit=3, token="me", lease_until=lease)
    assert [job.attempts for job in jobs] == [1, 1, 1]
    assert [_get(store, i).attempts for i in ids] == [1, 1, 1]
    assert all(_get(store, i).status is JobStatus.RUNNING for i in ids)


def test_a_claim_commits_without_waiting_for_the_disk_and_leaves_the_connection_durable(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    """A claim only has to outlive the worker, not the database server: its commit does
    not wait for the flush (PostgreSQL ``synchronous_commit`` off for that transaction,
    SQLite ``synchronous = NORMAL`` for it); every other transaction stays durable."""
    for _ in range(3):
        insert(store, new_job(), now)
    lease = now + timedelta(minutes=1)
    params = {"now": now, "limit": 1, "token": "me", "lease_until": lease, "actor": "w"}
    if store.driver.name == "postgresql":
        # Run inside an open transaction, the claim statement turns the wait off for it.
        sql, _build = store.driver._claim_statement("due", False, 1)
        with store.engine.connect() as conn, conn.begin():
            assert conn.exec_driver_sql("SHOW synchronous_commit").scalar() == "on"
            assert len(conn.exec_driver_sql(sql, params).all()) == 1
            assert conn.exec_driver_sql("SHOW synchronous_commit").scalar() == "off"
            conn.rollback()
        assert len(store.claim(now=now, limit=3, token="me", lease_until=lease)) == 3
        with store.engine.connect() as conn:  # the pool's connections are durable again
            assert conn.exec_driver_sql("SHOW synchronous_commit").scalar() == "on"
        return
    seen: list[str] = []

    @event.listens_for(store.engine, "connect")
    def traced(dbapi: Any, _record: Any) -> None:
        dbapi.set_trace_callback(seen.append)

    store.engine.dispose()
    assert len(store.claim(now=now, limit=3, token="me", lease_until=lease)) == 3
    statements = [
        sql.split()[0] if sql.startswith("BEGIN") else sql
        for sql in seen
        if sql.startswith(("PRAGMA synchronous", "BEGIN", "COMMIT"))
    ]
    assert statements == [
        "PRAGMA synchronous",
        "PRAGMA synchronous = NORMAL",
        "BEGIN",
        "COMMIT",
        "PRAGMA synchronous = 2",
    ], seen
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2


def test_a_claim_told_of_a_backlog_skips_the_look_before_the_write_lock(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    """SQLite reads whether anything is due before taking the write lock (an idle worker
    must not hold up the app's writes); a worker whose last claim came back full knows,
    and skips that read. The claim itself is the same: due jobs only."""
    insert(store, new_job(), now)
    insert(store, new_job(run_at=now + timedelta(hours=1)), now)
    seen: list[str] = []
    if store.driver.name == "sqlite":

        @event.listens_for(store.engine, "connect")
        def traced(dbapi: Any, _record: Any) -> None:
            dbapi.set_trace_callback(seen.append)

        store.engine.dispose()
    lease = now + timedelta(minutes=1)
    claimed = store.claim(now=now, limit=5, token="me", lease_until=lease, look_first=False)
    assert len(claimed) == 1 and claimed[0].run_at <= now
    if store.driver.name == "sqlite":
        before_lock = seen[: next(i for i, sql in enumerate(seen) if sql.startswith("BEGIN"))]
        assert not [sql for sql in before_lock if sql.lstrip().upper().startswith("SELECT")]
        seen.clear()
        store.claim(now=now, limit=5, token="me2", lease_until=lease)  # nothing due now
        assert any(sql.lstrip().upper().startswith("SELECT") for sql in seen)
        assert not any(sql.startswith("BEGIN") for sql in seen)  # no write lock taken
