"""``JobStore.refuses_values`` on both backends, with errors the servers really raise: a
write refused for what it holds is told apart from a database that cannot take it now.
The worker's flusher writes the first kind one outcome at a time and retries the second
whole (tests/engine/test_refused_outcomes.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from flask_defer.store import JobStore


def error_of(store: JobStore, *statements: str) -> SQLAlchemyError:
    """The error the last of *statements* raises, run in one transaction."""
    with pytest.raises(SQLAlchemyError) as caught, store.begin() as conn:
        for statement in statements:
            conn.execute(text(statement))
    return caught.value


def test_a_constraint_of_the_table_refuses_the_values(store: JobStore) -> None:
    error = error_of(store, f"INSERT INTO {store.quoted_table} (name) VALUES (NULL)")
    assert store.refuses_values(error)


def test_a_value_past_the_databases_own_size_limit_is_refused_for_its_values(
    store: JobStore, backend: str
) -> None:
    """SQLite's is DataError ("string or blob too big"); PostgreSQL's is SQLSTATE 54000
    ("requested length too large"), which psycopg raises as OperationalError, PEP 249's
    class for the database's state: only the driver can tell it apart."""
    too_big = (
        "SELECT zeroblob(2000000000)" if backend == "sqlite" else "SELECT repeat('x', 1073741824)"
    )
    error = error_of(store, too_big)
    assert store.refuses_values(error), error


def test_a_database_that_cannot_take_the_write_now_is_not_a_refusal(
    store: JobStore, backend: str, engine: Engine
) -> None:
    """Locked (SQLite) or cancelled for its time (PostgreSQL): the same write may pass
    when retried."""
    if backend == "postgresql":
        error = error_of(store, "SET LOCAL statement_timeout = 1", "SELECT pg_sleep(1)")
        assert not store.refuses_values(error), error
        return
    with engine.connect() as holder:
        holder.exec_driver_sql("BEGIN IMMEDIATE")
        try:
            error = error_of(
                store, "PRAGMA busy_timeout = 0", f"DELETE FROM {store.quoted_table}"
            )
        finally:
            holder.exec_driver_sql("ROLLBACK")
    assert "locked" in str(error)
    assert not store.refuses_values(error), error
