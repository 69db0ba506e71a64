"""Where jobs live: the engine's SQLite tuning and the session's "uncommitted jobs" mark.

These are the few places where flask_defer touches the application's engine and
session themselves, kept together so they are easy to audit.
"""

from __future__ import annotations

import os
from typing import Any

from flask import Flask
from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, scoped_session

from .config import DeferConfig
from .jobs import Fail
from .session_events import listen_once

#: Marks a session whose transaction holds scheduled jobs not yet committed.
UNCOMMITTED = "flask_defer.uncommitted"

#: Marks a session running an ``atomic=True`` handler, whose commit is the worker's.
ATOMIC = "flask_defer.atomic"

#: Set when an atomic handler tried to commit (kept even if it caught the error).
ATOMIC_COMMIT_REFUSED = "flask_defer.atomic_commit_refused"

ATOMIC_COMMIT_MESSAGE = (
    "atomic handlers must not commit: db.session.commit() inside an atomic=True handler "
    "would commit its effects without the job's done mark, so the job would run again; "
    "return instead and the worker commits both together"
)


class AtomicCommitRefused(Fail):
    """An ``atomic=True`` handler called ``db.session.commit()``; nothing was committed.

    A :class:`Fail`: another attempt would make the same call, so the job fails once.
    """


def default_sqlite_uri(app: Flask) -> str:
    """The embedded default: ``defer.sqlite3`` in the app's instance folder."""
    os.makedirs(app.instance_path, exist_ok=True)
    return "sqlite:///" + os.path.join(app.instance_path, "defer.sqlite3")


def tune_sqlite(engine: Engine, config: DeferConfig) -> None:
    """WAL lets the web read while the worker writes; the busy timeout makes writers wait."""
    busy_ms = int(config.sqlite_busy_timeout.total_seconds() * 1000)

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
            if engine.url.database not in (None, "", ":memory:"):
                cursor.execute("PRAGMA journal_mode = WAL")
        finally:
            cursor.close()

    event.listen(engine, "connect", on_connect)
    # Connections opened before init_app (if any) are replaced so all get the pragmas.
    engine.pool.dispose()


def clear_uncommitted(session: Session, transaction: Any) -> None:
    # Commit, rollback and close all end the root transaction.
    if transaction.parent is None:
        session.info.pop(UNCOMMITTED, None)


def refuse_atomic_commit(session: Session) -> None:
    # Raising here, before anything is flushed or committed, leaves the transaction
    # open: the worker rolls it back and records one failure, instead of the job
    # running again after its effects were committed without its done mark.
    if session.info.get(ATOMIC):
        session.info[ATOMIC_COMMIT_REFUSED] = True
        raise AtomicCommitRefused(ATOMIC_COMMIT_MESSAGE)


def track_uncommitted(session: scoped_session[Session]) -> None:
    """Clear the mark whenever the session's transaction ends (commit or rollback).

    Also refuses a commit from inside an ``atomic=True`` handler (see
    :data:`ATOMIC`): the worker commits that transaction together with the done mark.
    """
    # Not event.contains(): it can alias a collected Session class (see session_events).
    listen_once(session, "after_transaction_end", clear_uncommitted)
    listen_once(session, "before_commit", refuse_atomic_commit)
