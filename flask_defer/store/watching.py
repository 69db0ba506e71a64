"""What the hot paths that skip SQLAlchemy's execution keep of it: who watches, its errors.

The claim (both drivers), PostgreSQL's one-job insert, SQLite's acknowledgement
batch and SQLite's single history event (an Undo's) run on the database driver's
own cursor, past SQLAlchemy's execution, whose per-call work cost more than the
statements (profiled). SQL logging (``echo``), tracing instrumentation and
Flask-SQLAlchemy's recorded queries see statements through SQLAlchemy's cursor
events, so while any of them listens, those paths go through SQLAlchemy instead.
(SQLite's one-job insert does not ask: the question cost a tenth of a
``schedule()``.) Their errors are the ones SQLAlchemy would raise
(:func:`sqlalchemy_error`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, StatementError


def watched(conn: Connection) -> bool:
    """Whether *conn*'s engine logs its statements or has cursor listeners (flask_defer
    installs none: SQLite's write lock wraps the dialect instead)."""
    dispatch = conn.dispatch
    return bool(
        conn.engine.echo or dispatch.after_cursor_execute or dispatch.before_cursor_execute
    )


def sqlalchemy_error(
    conn: Connection, statement: str, params: Any, error: Exception, *, invalidated: bool = False
) -> StatementError:
    """The driver's *error* as ``conn.execute`` would have raised it: SQLAlchemy's class
    for it (``IntegrityError``, ``OperationalError`` ...), *invalidated* when the
    connection was lost, and the parameters (a job's payload) left out of the message
    when the engine hides them (``create_engine(hide_parameters=True)``)."""
    dialect = conn.dialect
    return DBAPIError.instance(
        statement, params, error, dialect.loaded_dbapi.Error,
        hide_parameters=conn.engine.hide_parameters,
        connection_invalidated=invalidated, dialect=dialect,
    )  # fmt: skip
