"""Whether anyone watches an engine's statements, for the hot paths that skip SQLAlchemy.

The claim (both drivers) and SQLite's acknowledgement batch run on the database
driver's own cursor, past SQLAlchemy's execution, whose per-call work cost more than
the statements (profiled). SQL logging (``echo``), tracing instrumentation and
Flask-SQLAlchemy's recorded queries see statements through SQLAlchemy's cursor events,
so while any of them listens, those paths go through SQLAlchemy instead. (SQLite's
one-job insert does not ask: the question cost a tenth of a ``schedule()``.)
"""

from __future__ import annotations

from sqlalchemy import Connection


def watched(conn: Connection, *, own_listeners: int = 0) -> bool:
    """Whether *conn*'s engine logs its statements or has cursor listeners beyond the
    *own_listeners* ``before_cursor_execute`` ones flask_defer itself installed."""
    dispatch = conn.dispatch
    return bool(
        conn.engine.echo
        or dispatch.after_cursor_execute
        or len(dispatch.before_cursor_execute) > own_listeners
    )
