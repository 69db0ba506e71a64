"""One app's state, assembled complete: where its jobs live and every part over them.

:func:`build_state` reads the config once, finds the engine, the jobs table and the
session to join, and builds the store, the transactions, the executor, the runner, the
recurring schedules and the metrics, in the order each needs the last, into one
:class:`~.state.DeferState` that is never changed afterwards. With Flask-SQLAlchemy
(``init_app(app, db=db)``) the jobs table joins ``db.metadata`` and scheduling joins
``db.session``; without it, flask_defer has an engine of its own
(``DEFER_DATABASE_URI``, else a SQLite file in the instance folder).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from typing import Any

from blinker import Signal
from flask import Flask
from sqlalchemy import Engine, MetaData, Table, create_engine
from sqlalchemy.pool import NullPool

from ..config import DeferConfig, apply_defaults, load_config
from ..engine.execution import Executor
from ..engine.runner import Runner
from ..engine.ticks import RecurringTicks
from ..errors import NotConfigured
from ..registry import Registry, UndoHooks
from ..store import JobStore, driver_class, versioning
from ..store.schema import (
    SchemaNames,
    define_history_table,
    define_jobs_table,
    define_pauses_table,
)
from ..store.transactions import Transactions
from .health import Health
from .reads import health
from .state import DeferState


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


#: Builds an app's recurring schedules from its store, config, ``db`` and a way to send
#: signals (``init_app`` passes the extension's declarations this way).
RecurringFactory = Callable[[JobStore, DeferConfig, Any, Callable[..., None]], RecurringTicks]


def build_state(
    app: Flask,
    *,
    registry: Registry,
    undo_hooks: UndoHooks | None = None,
    db: Any = None,
    table_name: str = "defer_jobs",
    extension: Any = None,
    on_session: Collection[Callable[[Any], None]] = (),
    recurring: RecurringFactory | None = None,
) -> DeferState:
    """Read *app*'s config, find its engine and build its state (not yet registered).

    With *db* (Flask-SQLAlchemy, already bound to *app*) the table joins
    ``db.metadata`` and the transactions join ``db.session``; each of *on_session*
    is then called with the session (a helper installing its query filter). Without
    one, jobs live in ``DEFER_DATABASE_URI`` or a SQLite file in the instance folder,
    and the table is created at once. *recurring* builds the app's recurring schedules
    over its parts (the engine ticks them through a Protocol).
    """
    # Long on purpose: the one place an app's parts are built, in the order each needs
    # the last (engine, store, transactions, executor, runner, state); split, that order
    # would be spread over functions that each take most of the others.
    apply_defaults(app.config)
    config = load_config(app.config)
    engine, table, session = engine_table_session(app, config, db, table_name)
    # The driver tunes the engine once, before any connection is used (SQLite: WAL, the
    # busy timeout, writers taking turns).
    driver_class(engine.dialect).prepare_engine(
        engine, config.sqlite_busy_timeout, config.sqlite_synchronous
    )
    # The history table joins the jobs table's metadata (db.create_all, autogenerate).
    history = define_history_table(table.metadata, table.name) if config.history else None
    # So is the pauses table, always (the claim reads it).
    store = JobStore(engine, table, history, define_pauses_table(table.metadata, table.name))
    # A job due later than a worker's longest sleep needs no NOTIFY to be on time.
    store.notify_horizon = config.max_sleep
    if config.listen_database_uri is not None:
        # Behind a transaction-mode pooler: the worker's LISTEN gets a direct connection
        # of its own, opened when a worker starts (no pool: it is one long connection).
        store.listen_engine = create_engine(config.listen_database_uri, poolclass=NullPool)
    if session is None:
        store.create_table(history=False)
        if versioning.check(engine, SchemaNames(jobs=table.name)).ok:
            # A jobs table created just now was recorded at the newest revision, which
            # includes the history and pauses tables. On an older recorded schema they
            # come from `flask defer db upgrade` (revisions flask_defer_0003 and 0007):
            # creating them here would make those revisions fail on an existing table.
            store.create_table()
    transactions = Transactions(store, session)
    for hook in on_session if session is not None else ():
        hook(session)

    def emit(signal: Signal, **kwargs: Any) -> None:
        state.send(signal, **kwargs)  # the executor's signals go the one way too

    executor = Executor(
        store,
        registry,
        policy=config.retry_policy(),
        context_factory=app.app_context,
        atomic_scope=lambda: transactions.atomic(handler=True),
        emit=emit,
        uncommitted=transactions.holds_uncommitted if session is not None else None,
        sqlite_busy_timeout=config.sqlite_busy_timeout,
    )
    runner = Runner(store, executor, lease=config.lease, claim_batch=config.claim_batch)
    ticker = recurring(store, config, db, emit) if recurring is not None else None
    metrics = None
    if config.metrics:
        from .metrics import Metrics

        def current_health() -> Health:
            # A scrape can come from any thread (a worker's metrics server).
            with app.app_context():
                return health(state)

        metrics = Metrics(app, health=current_health)
    state = DeferState(
        extension=extension,
        config=config,
        store=store,
        transactions=transactions,
        executor=executor,
        runner=runner,
        registry=registry,
        undo_hooks=undo_hooks if undo_hooks is not None else UndoHooks(),
        app=app,
        db=db,
        metrics=metrics,
        recurring=ticker,
    )
    return state
