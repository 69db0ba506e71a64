"""Where an app's jobs live: the engine, the jobs table and the session to join.

With Flask-SQLAlchemy (``init_app(app, db=db)``) the jobs table joins ``db.metadata``
and scheduling joins ``db.session``; without it, flask_defer has an engine of its own
(``DEFER_DATABASE_URI``, else a SQLite file in the instance folder).
"""

from __future__ import annotations

import os
from typing import Any

from flask import Flask
from sqlalchemy import Engine, MetaData, Table, create_engine

from ..config import DeferConfig
from ..errors import NotConfigured
from ..store.schema import define_jobs_table


def default_sqlite_uri(app: Flask) -> str:
    """The embedded default: ``defer.sqlite3`` in the app's instance folder."""
    os.makedirs(app.instance_path, exist_ok=True)
    return "sqlite:///" + os.path.join(app.instance_path, "defer.sqlite3")


def engine_table_session(
    app: Flask, config: DeferConfig, db: Any, table_name: str
) -> tuple[Engine, Table, Any]:
    """Where *app*'s jobs live: ``db``'s engine and session, or an engine of our own."""
    if db is not None:
        if "sqlalchemy" not in app.extensions:
            raise NotConfigured(
                "Flask-SQLAlchemy is not set up on this app yet: "
                "call db.init_app(app) before defer.init_app(app, db=db)"
            )
        table = define_jobs_table(db.metadata, table_name)
        with app.app_context():
            engine: Engine = db.engine
        return engine, table, db.session
    engine = create_engine(config.database_uri or default_sqlite_uri(app))
    return engine, define_jobs_table(MetaData(), table_name), None
