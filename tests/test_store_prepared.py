"""The store's prepared hot-path statements send exactly the SQL built per call before.

The claim and the acknowledgements are built once per shape with bind parameters
(building them per job cost more than the round trip). These tests compile the reused
statement and the per-call construction it replaced, on both dialects, and compare the
SQL text and the parameter values in order.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import Dialect, MetaData, select, update
from sqlalchemy.dialects import postgresql, sqlite

from flask_defer.jobs import Job, JobStatus
from flask_defer.schema import define_jobs_table
from flask_defer.store import JobStore, NewJob

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def _dialect(backend: str) -> Dialect:
    if backend == "postgresql":
        return postgresql.psycopg.dialect(paramstyle="format")  # type: ignore[no-any-return]
    return sqlite.dialect()  # type: ignore[no-any-return]


def _sent(stmt: Any, backend: str, params: dict[str, Any] | None = None) -> tuple[str, list[Any]]:
    """The SQL text (parameter names erased) and the bound values in order."""
    compiled = stmt.compile(dialect=_dialect(backend))
    values = compiled.construct_params(params or {})
    text = re.sub(r"__\[POSTCOMPILE_\w+\]", "__[POSTCOMPILE]", compiled.string)
    order = compiled.positiontup or []
    bound = []
    for name in order:
        processor = compiled._bind_processors.get(name)
        value = values[name]
        value = processor(value) if processor is not None else value
        # psycopg's Jsonb wrapper has no equality; compare what it wraps.
        bound.append(("jsonb", value.obj) if type(value).__name__ == "Jsonb" else value)
    return text, bound


class _Engine:
    """Just enough of an engine for JobStore to pick its dialect."""

    def __init__(self, backend: str) -> None:
        self.dialect = _dialect(backend)


def _store(backend: str) -> JobStore:
    return JobStore(_Engine(backend), define_jobs_table(MetaData()))  # type: ignore[arg-type]


def _claim_built_per_call(store: JobStore, queues: list[str] | None) -> Any:
    """The claim statement as ``claim()`` built it on every call before."""
    t = store.table
    due = (
        select(t.c.id)
        .where(t.c.status == JobStatus.PENDING.value, t.c.run_at <= NOW)
        .order_by(t.c.run_at, t.c.id)
        .limit(10)
        .with_for_update(skip_locked=True)
    )
    if queues:
        due = due.where(t.c.queue.in_(queues))
    values = {
        "status": JobStatus.RUNNING.value,
        "attempts": t.c.attempts + 1,
        "claim_token": "tok",
        "lease_expires_at": NOW + timedelta(seconds=30),
        "updated_at": NOW,
    }
    if store.is_postgres:
        due_cte = due.cte("due").prefix_with("MATERIALIZED")
        return update(t).where(t.c.id == due_cte.c.id).values(values).returning(*t.c)
    return (
        update(t)
        .where(t.c.id.in_(due.scalar_subquery()), t.c.status == JobStatus.PENDING.value)
        .values(values)
        .returning(*t.c)
    )


@pytest.mark.parametrize("queues", [None, ["mail", "sms"]])
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_prepared_claim_sends_the_same_sql_and_values(
    backend: str, queues: list[str] | None
) -> None:
    store = _store(backend)
    params: dict[str, Any] = {
        "claim_now": NOW,
        "claim_limit": 10,
        "claim_token": "tok",
        "claim_lease_until": NOW + timedelta(seconds=30),
        "claim_updated_at": NOW,
    }
    if queues:
        params["claim_queues"] = queues
    prepared = store._claim_statement(with_queues=bool(queues))

    text, bound = _sent(prepared, backend, params)
    expected_text, expected_bound = _sent(_claim_built_per_call(store, queues), backend)

    assert text == expected_text
    assert bound == expected_bound


def _claimed_job(**overrides: Any) -> Job:
    values: dict[str, Any] = {
        "id": 42,
        "name": "send_email",
        "payload": {},
        "status": JobStatus.RUNNING,
        "run_at": NOW,
        "due_at": NOW,
        "attempts": 1,
        "max_attempts": 3,
        "queue": "default",
        "claim_token": "tok",
    }
    values.update(overrides)
    return Job(**values)


ACKS: dict[str, Callable[[datetime], dict[str, Any]]] = {
    "done": lambda now: {
        **JobStore._settle_values(JobStatus.DONE, now),
        "last_error": None,
        "result": {"sent": True},
    },
    "done without a result": lambda now: {
        **JobStore._settle_values(JobStatus.DONE, now),
        "last_error": None,
        "result": None,
    },
    "retry": lambda now: {
        "status": JobStatus.PENDING.value,
        "run_at": now + timedelta(minutes=1),
        "last_error": "boom",
    },
    "failed": lambda now: {**JobStore._settle_values(JobStatus.FAILED, now), "last_error": "x"},
}


@pytest.mark.parametrize("ack", sorted(ACKS))
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_prepared_ack_sends_the_same_sql_and_values(backend: str, ack: str) -> None:
    store = _store(backend)
    job = _claimed_job()
    values = {
        **ACKS[ack](NOW),
        "claim_token": None,
        "lease_expires_at": None,
        "updated_at": NOW,
    }

    prepared, params = store._ack_statement(job, values)
    text, bound = _sent(prepared, backend, params)
    expected_text, expected_bound = _sent(store._guarded_ack(job).values(values), backend)

    # Same columns in the same order, same guard, same values.
    assert _normalised(text) == _normalised(expected_text)
    assert bound == expected_bound


def _normalised(text: str) -> str:
    return text.replace("\n", " ")


def test_prepared_statements_are_built_once_per_shape() -> None:
    store = _store("postgresql")
    first = store._claim_statement(with_queues=False)
    assert store._claim_statement(with_queues=False) is first
    assert store._claim_statement(with_queues=True) is not first
    values = {**ACKS["done"](NOW), "claim_token": None, "lease_expires_at": None, "updated_at": NOW}
    one, _ = store._ack_statement(_claimed_job(), values)
    two, params = store._ack_statement(_claimed_job(id=7, claim_token="other"), values)
    assert one is two
    assert params["ack_id"] == 7 and params["ack_token"] == "other"


def test_expression_values_and_tokenless_jobs_keep_the_per_call_statement() -> None:
    store = _store("sqlite")
    t = store.table
    snooze = {"status": JobStatus.PENDING.value, "attempts": t.c.attempts - 1}
    stmt, params = store._ack_statement(_claimed_job(), snooze)
    assert params == {}
    assert "attempts=(defer_jobs.attempts - ?)" in str(stmt.compile(dialect=sqlite.dialect()))

    tokenless = _claimed_job(claim_token=None)
    stmt, params = store._ack_statement(tokenless, {"status": "done"})
    assert params == {}
    assert "claim_token IS NULL" in str(stmt.compile(dialect=sqlite.dialect()))


def test_claim_then_ack_round_trip_on_a_real_database(
    store: JobStore, new_job: Callable[..., NewJob], now: datetime
) -> None:
    # The reused statements, executed twice on the backend under test.
    for round_number in range(2):
        with store.begin() as conn:
            store.insert(conn, new_job(run_at=now), now=now, replace=False)
        (job,) = store.claim(now=now, limit=5, token=f"t{round_number}", lease_until=now)
        assert job.claim_token == f"t{round_number}" and job.attempts == 1
        assert store.ack_done(job, now=now, result={"n": round_number})
        assert not store.ack_done(job, now=now)  # the token no longer owns it
        with store.begin() as conn:
            done = store.get(conn, job_id=job.id)
        assert done is not None and done.status is JobStatus.DONE
        assert done.result == {"n": round_number} and done.finished_at == now


# -- the UTC timestamp type remembers the last value it bound ------------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_utc_datetime_binding_is_unchanged_by_remembering(backend: str) -> None:
    from flask_defer.schema import UTCDateTime

    dialect = _dialect(backend)
    remembering = UTCDateTime().bind_processor(dialect)
    plain = UTCDateTime().process_bind_param
    impl = UTCDateTime().impl_instance.bind_processor(dialect)

    def expected(value: datetime | None) -> Any:
        converted = plain(value, dialect)
        return impl(converted) if impl is not None and converted is not None else converted

    paris = datetime(2030, 1, 1, 13, 0, tzinfo=UTC).astimezone(ZoneInfo("Europe/Paris"))
    values = [NOW, NOW, None, NOW + timedelta(microseconds=1), NOW, paris, paris, None]
    assert remembering is not None
    assert [remembering(v) for v in values] == [expected(v) for v in values]
    # Equal but distinct objects are converted, not matched by identity alone.
    twin = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    assert remembering(twin) == expected(twin)
    with pytest.raises(ValueError, match="aware"):
        remembering(datetime(2030, 1, 1, 12, 0))


# -- scheduling: insert and NOTIFY ----------------------------------------------------


def _insert_built_per_call(store: JobStore, values: dict[str, Any], keyed: bool) -> Any:
    """The insert as ``insert()`` built it on every call before."""
    from sqlalchemy import insert

    from flask_defer.schema import LIVE_STATUSES

    t = store.table
    if not keyed:
        return insert(t).values(values).returning(*t.c)
    dialect_insert = postgresql.insert if store.is_postgres else sqlite.insert
    return (
        dialect_insert(t)
        .values(values)
        .on_conflict_do_nothing(index_elements=[t.c.key], index_where=t.c.status.in_(LIVE_STATUSES))
        .returning(*t.c)
    )


@pytest.mark.parametrize("keyed", [False, True])
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_prepared_insert_sends_the_same_sql_and_values(backend: str, keyed: bool) -> None:
    store = _store(backend)
    new = NewJob(
        name="send_email",
        payload={"message_id": 7, "to": ["a@example.com"]},
        run_at=NOW + timedelta(hours=1),
        max_attempts=3,
        key="message:7:send" if keyed else None,
        owner="alice",
        undo_until=NOW + timedelta(seconds=59),
    )
    values = store._row_values(new, NOW)
    params = {f"new_{name}": value for name, value in values.items()}

    prepared = store._insert_statement(tuple(values), keyed=keyed)
    text, bound = _sent(prepared, backend, params)
    expected_text, expected_bound = _sent(_insert_built_per_call(store, values, keyed), backend)

    assert text == expected_text
    assert bound == expected_bound


def test_prepared_notify_sends_the_same_sql_and_values() -> None:
    from sqlalchemy import func

    from flask_defer.store import NOTIFY_CHANNEL

    store = _store("postgresql")
    params = {"notify_channel": NOTIFY_CHANNEL, "notify_queue": "mail"}
    text, bound = _sent(store._notify_statement(), "postgresql", params)
    expected = _sent(select(func.pg_notify(NOTIFY_CHANNEL, "mail")), "postgresql")
    assert (text, bound) == expected


# -- the SQLite bulk insert hands the driver tuples ---------------------------------


def test_sqlite_bulk_insert_stores_exactly_what_sqlalchemy_executemany_stores(
    tmp_path: Any,
) -> None:
    import sqlite3
    from contextlib import closing

    from sqlalchemy import create_engine, insert

    jobs = [
        NewJob(
            name="remind",
            payload=payload,
            run_at=NOW + timedelta(hours=1, microseconds=n % 3),
            max_attempts=3,
            queue="mail" if n % 2 else "default",
            owner="alice" if n % 3 else None,
            label=None if n % 4 else "Reminder",
            undo_until=NOW + timedelta(seconds=5) if n % 5 == 0 else None,
        )
        for n, payload in enumerate(
            [{}, {"n": 1}, [1, 2.5, "x"], {"nested": {"é": None}}, "text", 7, {"b": True}]
        )
    ]
    paths = {}
    for way in ("store", "sqlalchemy"):
        paths[way] = tmp_path / f"{way}.sqlite3"
        engine = create_engine(f"sqlite:///{paths[way]}")
        store = JobStore(engine, define_jobs_table(MetaData()))
        store.create_table()
        with store.begin() as conn:
            if way == "store":
                assert store.insert_many(conn, jobs, now=NOW) == len(jobs)
            else:
                conn.execute(insert(store.table), [store._row_values(j, NOW) for j in jobs])
        engine.dispose()

    def stored(path: Any) -> list[tuple[Any, ...]]:
        with closing(sqlite3.connect(path)) as conn:
            return conn.execute("SELECT * FROM defer_jobs ORDER BY id").fetchall()

    assert stored(paths["store"]) == stored(paths["sqlalchemy"])
    assert len(stored(paths["store"])) == len(jobs)
