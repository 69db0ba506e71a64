"""A Flask app with Flask-SQLAlchemy and no flask_defer: what the session costs by itself.

``schedule()`` joins the caller's ``db.session`` transaction by design, so no enqueue
through it can cost less than the session's own BEGIN, INSERT and COMMIT. This app
sends the same INSERT as :meth:`bench.fd.FlaskDeferApp.session_insert_each` through a
session that flask_defer never touched (no write lock taken in turn on SQLite, no
session listeners), with the engine's defaults and the bench app's pool size. The
difference between the two is what flask_defer adds to every write transaction of an
app; the difference between this and the raw loop is SQLAlchemy's and
Flask-SQLAlchemy's, which no extension of them can take away.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import text

from .app import NOOP, time_binder
from .env import Database


class PlainSessionApp:
    """A Flask-SQLAlchemy app on *database*, whose jobs table exists already."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self.app = Flask("bench-plain")
        self.app.config.update(
            SQLALCHEMY_DATABASE_URI=database.url,
            SQLALCHEMY_ENGINE_OPTIONS={"pool_size": 20, "max_overflow": 40},
        )
        self.db = SQLAlchemy(self.app)

    def session_insert_each(self, count: int, delay_seconds: float) -> int:
        """The INSERT of one job and a commit, *count* times, through ``db.session``."""
        with self.app.app_context():
            return insert_each_through(self.db.session, self.database.backend, count, delay_seconds)

    def close(self) -> None:
        with self.app.app_context():
            self.db.session.remove()
            self.db.engine.dispose()


#: The INSERT of one job, as SQL text: flask_defer's own columns, nothing more.
SESSION_INSERT = {
    backend: (
        "INSERT INTO defer_jobs (name, queue, payload, status, run_at, due_at, attempts,"
        " max_attempts, created_at, updated_at) VALUES (:name, 'default', "
        + ("CAST(:payload AS jsonb)" if backend == "postgresql" else ":payload")
        + ", 'pending', :run_at, :run_at, 0, 3, :now, :now)"
    )
    for backend in ("postgresql", "sqlite")
}


def insert_each_through(session: Any, backend: str, count: int, delay_seconds: float) -> int:
    """:data:`SESSION_INSERT` and a commit, *count* times, through *session* (a
    ``db.session``), the jobs due *delay_seconds* from now."""
    sql = text(SESSION_INSERT[backend])
    bound = time_binder(backend)
    for n in range(count):
        now = datetime.now(UTC)
        at = bound(now + timedelta(seconds=delay_seconds))
        session.execute(
            sql,
            {"name": NOOP, "payload": json.dumps({"n": n}), "run_at": at, "now": bound(now)},
        )
        session.commit()
    return count
