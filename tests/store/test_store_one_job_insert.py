"""The one-job insert (``store.insert``, what every ``schedule()`` runs), both
backends: it runs on the database driver's own cursor, past SQLAlchemy's execution,
so these pin what SQLAlchemy's execution would have given: the same stored row, its
``scheduled`` event, SQLAlchemy's errors, a lost connection invalidated, and (on
PostgreSQL) a watched engine that sees it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData, create_engine, event, select
from sqlalchemy import insert as sa_insert
from sqlalchemy.exc import DBAPIError, OperationalError

from flask_defer.store import JobStore, NewJob
from flask_defer.store.schema import define_history_table, define_jobs_table
from flask_defer.validation import payload_text

MakeJob = Callable[..., NewJob]

PAYLOADS: list[Any] = [{}, {"n": 1}, [1, 2.5, "x"], {"é": None, "deep": {"a": [True]}}, "text", 7]


def test_the_one_job_insert_stores_what_sqlalchemy_stores_with_its_scheduled_event(
    engine: Engine, new_job: MakeJob, now: datetime
) -> None:
    metadata = MetaData()
    store = JobStore(engine, define_jobs_table(metadata), define_history_table(metadata))
    store.create_table()
    jobs = [
        new_job(
            name=f"job{n}",
            payload=payload,
            run_at=now + timedelta(minutes=n),
            owner="alice" if n % 2 else None,
            label="Sent" if n % 3 == 0 else None,
            undo_until=now + timedelta(seconds=5) if n % 2 == 0 else None,
        )
        for n, payload in enumerate(PAYLOADS)
    ]
    jobs = [  # half with the JSON text schedule() made while validating the payload
        replace(job, payload_json=payload_text(job.payload, "payload")) if n % 2 else job
        for n, job in enumerate(jobs)
    ]
    t = store.table
    columns = [c for c in t.c if c.name != "id"]
    with store.begin() as conn:
        ids = [store.insert(conn, job, now=now, replace=False, actor="alice").id for job in jobs]
        conn.execute(sa_insert(t), [store.row_values(job, now) for job in jobs])
        rows = [tuple(row) for row in conn.execute(select(*columns).order_by(t.c.id))]
    assert rows[: len(jobs)] == rows[len(jobs) :]
    with store.begin() as conn:
        for job_id, job in zip(ids, jobs, strict=True):
            [scheduled] = store.history(conn, job_id)
            assert (scheduled.event, scheduled.actor, scheduled.run_at) == (
                "scheduled", "alice", job.run_at,
            )  # fmt: skip
            assert store.get(conn, job_id=job_id).payload == job.payload


def _refuse_inserts_named(engine: Engine, name: str) -> None:
    """A trigger that refuses the insert of a job called *name*, as a database may."""
    with engine.begin() as conn:
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql(
                "CREATE TRIGGER refuse BEFORE INSERT ON defer_jobs"
                f" WHEN NEW.name = '{name}'"
                " BEGIN SELECT RAISE(ABORT, 'refused by the database'); END"
            )
        else:
            conn.exec_driver_sql(
                "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$"
                " BEGIN RAISE EXCEPTION 'refused by the database'; END $$"
            )
            conn.exec_driver_sql(
                "CREATE TRIGGER refuse BEFORE INSERT ON defer_jobs FOR EACH ROW"
                f" WHEN (NEW.name = '{name}') EXECUTE FUNCTION refuse()"
            )


def test_a_refused_insert_raises_sqlalchemys_error_and_writes_nothing(
    history_store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    _refuse_inserts_named(history_store.engine, "refused")
    with history_store.begin() as conn:
        kept = history_store.insert(conn, new_job(name="kept"), now=now, replace=False).id
    with pytest.raises(DBAPIError) as raised:
        with history_store.begin() as conn:
            history_store.insert(conn, new_job(name="refused"), now=now, replace=False)
    assert "refused by the database" in str(raised.value)
    with history_store.begin() as conn:
        names = list(conn.execute(select(history_store.table.c.name)).scalars())
        assert names == ["kept"]
        assert [e.event for e in history_store.history(conn, kept)] == ["scheduled"]
        # The connection the error came back on still works.
        later = history_store.insert(conn, new_job(name="later"), now=now, replace=False)
    assert later.id > kept


@pytest.mark.parametrize("backend", ["postgresql"])
def test_an_insert_on_a_killed_connection_invalidates_it_and_the_next_one_reconnects(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    with pytest.raises(OperationalError) as raised:
        with store.begin() as conn:
            pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
            killer = create_engine(store.engine.url)
            with killer.connect() as other:
                other.exec_driver_sql("SELECT pg_terminate_backend(%s)", (pid,))
            killer.dispose()
            try:
                store.insert(conn, new_job(), now=now, replace=False)
            finally:
                invalidated = conn.invalidated
    assert raised.value.connection_invalidated and invalidated
    with store.begin() as conn:
        job_id = store.insert(conn, new_job(), now=now, replace=False).id
        assert store.get(conn, job_id=job_id) is not None


@pytest.mark.parametrize("backend", ["postgresql"])
@pytest.mark.parametrize("when", ["before_cursor_execute", "after_cursor_execute"])
def test_an_insert_on_a_watched_engine_is_seen_by_its_cursor_listeners(
    history_store: JobStore, new_job: MakeJob, now: datetime, when: str
) -> None:
    """SQL logging and tracing see the insert on PostgreSQL (on SQLite they do not: the
    driver's docstring says why)."""
    seen: list[str] = []

    def watch(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(history_store.engine, when, watch)
    try:
        with history_store.begin() as conn:
            job = history_store.insert(conn, new_job(), now=now, replace=False, actor="bob")
    finally:
        event.remove(history_store.engine, when, watch)
    inserts = [sql for sql in seen if "INSERT INTO defer_jobs " in sql]
    assert len(inserts) == 1 and "scheduled" in inserts[0]
    with history_store.begin() as conn:
        assert [e.actor for e in history_store.history(conn, job.id)] == ["bob"]
