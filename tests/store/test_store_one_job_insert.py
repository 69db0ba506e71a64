"""The one-job insert (``store.insert``, what every ``schedule()`` runs), both
backends: it runs on the database driver's own cursor, past SQLAlchemy's execution,
so these pin what SQLAlchemy's execution would have given: SQLAlchemy's errors
naming the statement that failed (parameters hidden when the engine hides them), a
lost connection invalidated, its own transaction begun, and (on PostgreSQL) a
watched engine that sees it; the same for a cancel's event, SQLite's other write
on the cursor. That it stores what SQLAlchemy's insert stores is ``test_store``'s
``test_the_store_inserts_store_what_sqlalchemy_stores...``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData, create_engine, event, func, select
from sqlalchemy.exc import DBAPIError, OperationalError

from flask_defer.store import JobStore, NewJob
from flask_defer.store.schema import define_history_table, define_jobs_table

from ..pg_databases import kill_server_side

MakeJob = Callable[..., NewJob]


def _refuse(engine: Engine, table: str, when: str) -> None:
    """A trigger that refuses inserts into *table* when *when* (over ``NEW``) holds,
    as a database may (a constraint, a full disk)."""
    with engine.begin() as conn:
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql(
                f"CREATE TRIGGER refuse BEFORE INSERT ON {table} WHEN {when}"
                " BEGIN SELECT RAISE(ABORT, 'refused by the database'); END"
            )
        else:
            conn.exec_driver_sql(
                "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$"
                " BEGIN RAISE EXCEPTION 'refused by the database'; END $$"
            )
            conn.exec_driver_sql(
                f"CREATE TRIGGER refuse BEFORE INSERT ON {table} FOR EACH ROW"
                f" WHEN ({when}) EXECUTE FUNCTION refuse()"
            )


def _counts(store: JobStore) -> tuple[int, int]:
    assert store.history_table is not None
    with store.begin() as conn:
        jobs = conn.execute(select(func.count()).select_from(store.table)).scalar_one()
        events = conn.execute(select(func.count()).select_from(store.history_table)).scalar_one()
    return jobs, events


@pytest.mark.parametrize(
    ("table", "when", "statement"),
    [
        ("defer_jobs", "NEW.name = 'refused'", "INSERT INTO defer_jobs "),
        # On SQLite the event is a second statement on the cursor; on PostgreSQL a CTE.
        ("defer_jobs_history", "NEW.actor = 'refused'", "defer_jobs_history"),
    ],
    ids=["the job row", "its scheduled event"],
)
def test_a_refused_insert_raises_sqlalchemys_error_naming_it_and_writes_nothing(
    history_store: JobStore, new_job: MakeJob, now: datetime, table: str, when: str,
    statement: str,
) -> None:  # fmt: skip
    _refuse(history_store.engine, table, when)
    with history_store.begin() as conn:
        kept = history_store.insert(conn, new_job(name="kept"), now=now, replace=False).id
    with history_store.engine.connect() as conn:
        with pytest.raises(DBAPIError) as raised:
            history_store.insert(
                conn, new_job(name="refused"), now=now, replace=False, actor="refused"
            )
        invalidated = conn.invalidated
        # A caller that catches the error and commits anyway: PostgreSQL aborted the
        # transaction, SQLite keeps it open; either way it must hold nothing of the job.
        conn.commit()
    assert "refused by the database" in str(raised.value)
    assert statement in str(raised.value.statement)
    assert not raised.value.connection_invalidated and not invalidated
    assert _counts(history_store) == (1, 1)
    with history_store.begin() as conn:
        later = history_store.insert(conn, new_job(name="later"), now=now, replace=False)
    assert later.id > kept and _counts(history_store) == (2, 2)


@pytest.mark.parametrize(
    ("table", "when"),
    [
        ("defer_jobs", "NEW.name = 'refused'"),
        # On SQLite the events are a second statement after the rows.
        ("defer_jobs_history", "NEW.actor = 'refused'"),
    ],
    ids=["a job row", "their scheduled events"],
)
def test_a_refused_bulk_insert_leaves_nothing_even_if_the_caller_commits(
    history_store: JobStore, new_job: MakeJob, now: datetime, table: str, when: str
) -> None:
    _refuse(history_store.engine, table, when)
    with history_store.begin() as conn:
        history_store.insert(conn, new_job(name="kept"), now=now, replace=False)
    batch = [new_job(name="bulk")] * 3 + [new_job(name="refused")]
    with history_store.engine.connect() as conn:
        with pytest.raises(DBAPIError, match="refused by the database"):
            history_store.insert_many(conn, batch, now=now, actor="refused")
        conn.commit()  # a caller that carries on: none of the batch may be in it
    assert _counts(history_store) == (1, 1)


def test_a_refused_insert_hides_the_payload_when_the_engine_hides_parameters(
    database_url: str, new_job: MakeJob, now: datetime
) -> None:
    engine = create_engine(database_url, hide_parameters=True)
    try:
        metadata = MetaData()
        jobs = define_jobs_table(metadata)
        store = JobStore(engine, jobs, define_history_table(metadata, jobs.name))
        store.create_table()
        _refuse(engine, "defer_jobs", "NEW.name = 'refused'")
        with pytest.raises(DBAPIError) as raised:
            with store.begin() as conn:
                job = new_job(name="refused", payload={"card": "4111-secret"})
                store.insert(conn, job, now=now, replace=False)
        message = str(raised.value)
        assert "refused by the database" in message
        assert "4111-secret" not in message and "hidden due to hide_parameters" in message
    finally:
        engine.dispose()


def test_an_insert_outside_a_transaction_begins_one_that_its_commit_commits(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    with store.engine.connect() as conn:
        job_id = store.insert(conn, new_job(), now=now, replace=False).id
        conn.commit()
    with store.begin() as conn:
        assert store.get(conn, job_id=job_id) is not None


@pytest.mark.parametrize("backend", ["postgresql"])
def test_an_insert_on_a_killed_connection_invalidates_it_and_the_next_one_reconnects(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    with pytest.raises(OperationalError) as raised:
        with store.begin() as conn:
            kill_server_side(conn)
            try:
                store.insert(conn, new_job(), now=now, replace=False)
            finally:
                invalidated = conn.invalidated  # before the block closes it
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


# -- a cancel's event, the other single-event write on the driver's cursor ------------


def test_a_refused_cancel_event_rolls_the_cancel_back_with_sqlalchemys_error(
    history_store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    """An Undo's ``undone`` event is written on the driver's cursor on SQLite (in the
    UPDATE's statement on PostgreSQL): refused, it raises SQLAlchemy's error and the
    job stays pending, as if nobody had pressed Undo."""
    with history_store.begin() as conn:
        job_id = history_store.insert(conn, new_job(owner="ann"), now=now, replace=False).id
    _refuse(history_store.engine, "defer_jobs_history", "NEW.event = 'undone'")
    with pytest.raises(DBAPIError) as raised:
        with history_store.begin() as conn:
            history_store.cancel(conn, now=now, job_id=job_id, owner="ann", event="undone")
    assert "refused by the database" in str(raised.value)
    with history_store.begin() as conn:
        assert history_store.get(conn, job_id=job_id).status.value == "pending"
        assert [e.event for e in history_store.history(conn, job_id)] == ["scheduled"]
    with history_store.begin() as conn:  # the same cancel, named otherwise, goes through
        cancelled = history_store.cancel(conn, now=now, job_id=job_id, owner="ann")
    assert cancelled is not None and cancelled.status.value == "cancelled"
    assert (cancelled.id, cancelled.owner) == (job_id, "ann")


@pytest.mark.parametrize("when", ["before_cursor_execute", "after_cursor_execute"])
def test_a_cancel_and_its_event_on_a_watched_engine_are_seen(
    history_store: JobStore, new_job: MakeJob, now: datetime, when: str
) -> None:
    seen: list[str] = []

    def watch(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(" ".join(statement.split()))

    with history_store.begin() as conn:
        job_id = history_store.insert(conn, new_job(), now=now, replace=False).id
    event.listen(history_store.engine, when, watch)
    try:
        with history_store.begin() as conn:
            assert history_store.cancel(conn, now=now, job_id=job_id, event="undone")
    finally:
        event.remove(history_store.engine, when, watch)
    assert any("INSERT INTO defer_jobs_history" in sql for sql in seen), seen
