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

from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import text

from .app import NOOP, time_binder
from .env import Database
from .fd import SESSION_INSERT


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
        sql = text(SESSION_INSERT[self.database.backend])
        bound = time_binder(self.database.backend)
        with self.app.app_context():
            for n in range(count):
                now = datetime.now(UTC)
                at = bound(now + timedelta(seconds=delay_seconds))
                self.db.session.execute(
                    sql,
                    {"name": NOOP, "payload": json.dumps({"n": n}), "run_at": at,
                     "now": bound(now)},
                )  # fmt: skip
                self.db.session.commit()
        return count

    def close(self) -> None:
        with self.app.app_context():
            self.db.session.remove()
            self.db.engine.dispose()
