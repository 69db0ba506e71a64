"""The Flask side of schema versioning: what ``init_app`` wires, kept small.

The web keeps serving on a schema that does not match the code (a deploy may start the
new web processes before ``flask defer db upgrade`` ran), but says so once, clearly;
the worker refuses to start instead (``Defer.worker``).
"""

from __future__ import annotations

import logging
import threading
import warnings

from flask import Flask

from .schema import SchemaNames
from .store import JobStore, versioning

logger = logging.getLogger("flask_defer")


def warn_once_on_mismatch(app: Flask, store: JobStore) -> None:
    """Before the app's first request, log one warning if the schema does not match.

    Checked lazily, not in ``init_app``: tests and factories create the tables after
    ``init_app``, and a database that is down at import time must not break startup.
    """
    done = threading.Event()

    def check_schema() -> None:
        if done.is_set():
            return
        done.set()
        try:
            status = versioning.check(store.engine, SchemaNames(jobs=store.table.name))
        except Exception:  # the request itself will report a database that is down
            logger.warning("flask_defer could not check its schema version", exc_info=True)
            return
        if not status.ok:
            logger.warning("%s (the web keeps serving; workers refuse to start)", status.message)

    app.before_request(check_schema)


def warn_if_app_database_ignored(app: Flask) -> None:
    """Warn when ``init_app(app)`` got no ``db`` in an app that has Flask-SQLAlchemy.

    Jobs would silently go to a SQLite file in the instance folder: outside the app's
    transactions and migrations, and one file per host.
    """
    if "sqlalchemy" in app.extensions:
        warnings.warn(
            "flask_defer: this app uses Flask-SQLAlchemy but init_app() got no db, so jobs "
            "go to a separate SQLite file (instance/defer.sqlite3), outside the app's "
            "transactions and migrations; pass defer.init_app(app, db=db) "
            "(or set DEFER_DATABASE_URI to keep them apart on purpose)",
            UserWarning,
            stacklevel=3,
        )
