"""The ``Defer`` extension: its declarations and its wiring into a Flask app.

Every public method is inherited from :class:`~flask_defer.facade.DeferFacade`, the
one facade that Python code, the web blueprint and the CLI call. This module adds what
only the extension object does: keep the declarations made before any app exists, and
``init_app``: read the config into the per-app state, then register the CLI group and
the blueprint. It stands above ``cli/`` and ``web/`` (it imports them to register
them), and they reach the facade below them, so there is no import circle.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from flask import Flask

from .cli import defer_cli
from .engine.embedded import EMBEDDED_SHUTDOWN_GRACE, EmbeddedWorker
from .engine.worker import Worker
from .facade import DeferFacade, current_defer
from .facade.declarations import DashboardAuth
from .features import builtin_handlers
from .features import recurring as _recurring
from .features import soft_delete as _soft_delete
from .features.owner import OwnerLoader
from .operations import running
from .operations.assembly import build_state
from .registry import Registry, UndoHooks
from .store import JobStore, versioning
from .store.schema import (
    DEFAULT_SCHEDULES_TABLE_NAME,
    DEFAULT_TABLE_NAME,
    SchemaNames,
    define_activity_table,
    define_dependencies_table,
    define_jobs_table,
    define_pauses_table,
    define_schedules_table,
    define_starts_table,
    define_workers_table,
)
from .web import init_web

__all__ = ["DashboardAuth", "Defer", "current_defer"]


class Defer(DeferFacade):
    """Durable, cancellable delayed jobs for a Flask app.

    Create it at module level and bind it later, like Flask-SQLAlchemy::

        db = SQLAlchemy(model_class=Base)
        defer = Defer()
        defer.init_app(app, db=db)   # after db.init_app(app)

    With a ``db``, the ``defer_jobs`` table lives in ``db.metadata`` and scheduling
    joins ``db.session``'s transaction. Without one, jobs live in their own SQLite file
    in the instance folder (or ``DEFER_DATABASE_URI``) and every call commits at once.
    """

    def __init__(
        self,
        app: Flask | None = None,
        db: Any = None,
        *,
        table_name: str = DEFAULT_TABLE_NAME,
        schedules_table_name: str = DEFAULT_SCHEDULES_TABLE_NAME,
    ) -> None:
        self.registry = Registry()
        #: ``defer.recurring(...)`` declarations (every app bound to this one ticks them).
        self.schedules = _recurring.Declarations()
        self.schedules_table_name = schedules_table_name
        self.undo_hooks = UndoHooks()
        # The built-in jobs (purge, HTTP) and the undo hook that restores a row.
        builtin_handlers(self.registry, self.undo_hooks)
        self.db = db
        self.table_name = table_name
        # -- Undo UI --
        self._owner_loader: OwnerLoader | None = None
        # -- the operator dashboard --
        self._dashboard_auth: DashboardAuth | None = None
        if db is not None:
            # Defining the table now puts it in the metadata before create_all or
            # Alembic look, whatever order the app sets things up in.
            table = define_jobs_table(db.metadata, table_name)
            # ... and db.create_all() records the revision, even in a process that
            # never calls init_app.
            versioning.record_on_create(table)
            define_schedules_table(db.metadata, schedules_table_name)
            define_pauses_table(db.metadata, table_name)
            define_dependencies_table(db.metadata, table_name)
            define_starts_table(db.metadata, table_name)
            define_workers_table(db.metadata, table_name)
            define_activity_table(db.metadata, table_name)
        if app is not None:
            self.init_app(app, db=db)

    # -- wiring -------------------------------------------------------------------

    def init_app(self, app: Flask, db: Any = None) -> None:
        """Bind to *app*: read config, find the engine, and register CLI and blueprint."""
        if "defer" in app.extensions:
            raise RuntimeError(
                "flask_defer is already registered on this app; call init_app once per app"
            )
        db = db if db is not None else self.db
        if db is not None and self.db is None:
            self.db = db
        state = build_state(
            app,
            registry=self.registry,
            undo_hooks=self.undo_hooks,
            db=db,
            table_name=self.table_name,
            extension=self,
            # features: hide soft-deleted rows from the app's ORM queries, and the
            # recurring schedules, ticked by this app's worker and run_due.
            on_session=(_soft_delete.install_query_filter,),
            recurring=self._ticker_for,
        )
        app.extensions["defer"] = state
        config = state.config
        if db is None and not config.database_uri:
            warn_if_app_database_ignored(app)
        # -- migrations: one warning on the web side when the schema does not match --
        warn_once_on_mismatch(app, state.store)
        # -- the worker: an embedded one for development ---------------------------
        if config.embedded_worker:
            grace = min(config.shutdown_grace, EMBEDDED_SHUTDOWN_GRACE)

            def check() -> None:  # as flask defer worker's, asked from the thread
                migrate = "migrate" in app.extensions
                names = replace(self._tables(state), app_migrations=migrate)
                versioning.require_current(state.store.engine, names)

            install_embedded_worker(
                app, lambda: running.build_worker(state, shutdown_grace=grace), check
            )

        app.cli.add_command(defer_cli)
        # -- Undo UI: blueprint, defer_toasts() and the htmx refresh trigger --
        init_web(app, config)


def is_serving_process() -> bool:
    """True in the process that will serve ``flask run`` requests.

    That is the reloader's child, or ``flask run`` with the reloader off. The
    reloader's watcher process imports the app too but never serves.
    """
    if os.environ.get("WERKZEUG_RUN_MAIN") == "true":
        return True
    import click

    ctx = click.get_current_context(silent=True)
    if ctx is None or ctx.info_name != "run":
        return False
    reload = ctx.params.get("reload")
    if reload is None:
        from flask.helpers import get_debug_flag

        reload = get_debug_flag()
    return not reload


def install_embedded_worker(
    app: Flask, make_worker: Callable[[], Worker], check: Callable[[], None] | None = None
) -> EmbeddedWorker:
    """Arrange for *app*'s embedded worker to start once, in the serving process.

    *check* raises while the schema does not match the code (see ``EmbeddedWorker``).
    """
    embedded = EmbeddedWorker(make_worker, check)
    app.extensions["defer.embedded_worker"] = embedded
    if is_serving_process():
        embedded.start()

    @app.before_request
    def _start_embedded_worker() -> None:
        embedded.start()

    return embedded


# -- the Flask side of schema versioning ------------------------------------------
# The web keeps serving on a schema that does not match the code (a deploy may start
# the new web processes before `flask defer db upgrade` ran), but says so once,
# clearly; the worker refuses to start instead (``Defer.worker``).

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
