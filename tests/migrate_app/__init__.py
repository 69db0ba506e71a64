"""Sample Flask-Migrate apps for tests/store/test_migrations.py, as the README shows them.

``FLASK_APP=tests.migrate_app:create_app`` includes flask_defer's revisions (the
"Upgrading" section's Flask-Migrate path); ``...:create_plain_app`` lets the app's own
autogenerate own the jobs table; ``...:create_admin_app`` shares the models and the
migrations folder but never calls ``defer.init_app``.
"""

from __future__ import annotations

import os

from flask import Flask
from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from flask_defer import Defer
from flask_defer.migrations import include_in


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)
# Defer(db=db) at import time puts defer_jobs in db.metadata in every process that
# imports the models, whether or not it calls init_app.
defer = Defer(db=db)


class Note(db.Model):  # type: ignore[name-defined, misc]
    id: Mapped[int] = mapped_column(primary_key=True)
    text: Mapped[str] = mapped_column(String(100))


@defer.job("send_email")
def send_email(job: object) -> None:
    pass


def _app() -> Flask:
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = os.environ["DATABASE_URL"]
    app.config["SECRET_KEY"] = "migrate-app"
    db.init_app(app)
    return app


def create_app() -> Flask:
    app = _app()
    defer.init_app(app, db=db)
    include_in(Migrate(db=db)).init_app(app)
    return app


def create_plain_app() -> Flask:
    app = _app()
    defer.init_app(app, db=db)
    Migrate(app, db)
    return app


def create_admin_app() -> Flask:
    app = _app()
    include_in(Migrate(db=db)).init_app(app)
    return app
