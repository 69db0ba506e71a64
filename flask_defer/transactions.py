"""Transaction policy: which transaction a flask_defer call writes in (no Flask here).

The product's promise is "the job commits with your change". With the app's
Flask-SQLAlchemy session, scheduling *joins* that session's transaction: the row
becomes real when the caller commits and disappears if it rolls back. Without a
session every call uses a short transaction of its *own*. Operations that must decide
a race on their own (cancel, reschedule, undo, prune, run_due) always run in their own
transaction, and refuse to start while the session holds scheduled jobs that are not
committed yet (on SQLite they would wait for the session's write lock and then fail
with "database is locked"). An *atomic* scope is the handler's session transaction,
committed together with the job's done mark.

One :class:`Transactions` is built per app at ``init_app`` from the session (or none)
and the store, and every caller goes through it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session, scoped_session

from .errors import NotConfigured
from .jobs import Fail
from .session_events import listen_once
from .store import JobStore

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


def refuse_atomic_commit(session: Session) -> None:
    """Refuse a commit of the session while an ``atomic=True`` handler runs in it."""
    # Raising here, before anything is flushed or committed, leaves the transaction
    # open: the worker rolls it back and records one failure, instead of the job
    # running again after its effects were committed without its done mark.
    if session.info.get(ATOMIC):
        session.info[ATOMIC_COMMIT_REFUSED] = True
        raise AtomicCommitRefused(ATOMIC_COMMIT_MESSAGE)


def clear_uncommitted(session: Session, transaction: Any) -> None:
    """Drop the "uncommitted jobs" mark when *session*'s root transaction ends."""
    # Commit, rollback and close all end the root transaction.
    if transaction.parent is None:
        session.info.pop(UNCOMMITTED, None)


def track_uncommitted(session: scoped_session[Session]) -> None:
    """Clear the mark whenever the session's transaction ends (commit or rollback)."""
    # Not event.contains(): it can alias a collected Session class (see session_events).
    listen_once(session, "after_transaction_end", clear_uncommitted)
    listen_once(session, "before_commit", refuse_atomic_commit)


class Transactions:
    """The joined, own and atomic scopes of one app, and the "uncommitted jobs" guard."""

    def __init__(self, store: JobStore, session: scoped_session[Session] | None) -> None:
        self.store = store
        #: The app's Flask-SQLAlchemy session, or None when flask_defer owns its engine.
        self.session = session
        if session is not None:
            track_uncommitted(session)

    @contextmanager
    def joined(self, *, writes: bool = False) -> Iterator[Connection]:
        """The connection of the caller's transaction (the session), or a short own one.

        ``writes=True`` marks the session as holding uncommitted jobs, so that
        :meth:`refuse_uncommitted` can explain a call that would wait for its lock.
        """
        if self.session is None:
            with self.store.begin() as conn:
                yield conn
            return
        conn = self.session.connection(bind_arguments={"clause": self.store.table})
        if writes:
            self.session.info[UNCOMMITTED] = True
        yield conn

    @contextmanager
    def own(self, operation: str | None = None) -> Iterator[Connection]:
        """A transaction of its own, committed on exit; refused for *operation* if the
        session holds uncommitted jobs (``None``: no such check)."""
        if operation is not None:
            self.refuse_uncommitted(operation)
        with self.store.begin() as conn:
            yield conn

    @contextmanager
    def atomic(self, *, handler: bool = False) -> Iterator[Connection]:
        """A transaction on the handler's session, committed with the job's done mark.

        With *handler* (an ``atomic=True`` handler runs in it), a commit of the
        session's own is refused (see :data:`ATOMIC`).
        """
        if self.session is None:
            with self.store.begin() as conn:
                yield conn
            return
        session = self.session
        if handler:
            session.info[ATOMIC] = True
        try:
            try:
                yield session.connection(bind_arguments={"clause": self.store.table})
                if session.info.pop(ATOMIC_COMMIT_REFUSED, False):
                    # The handler caught the refusal and returned: still a failure, so
                    # the author learns their commit did not happen.
                    raise AtomicCommitRefused(ATOMIC_COMMIT_MESSAGE)
            finally:
                session.info.pop(ATOMIC, None)
                session.info.pop(ATOMIC_COMMIT_REFUSED, None)
        except BaseException:
            session.rollback()
            raise
        session.commit()

    def holds_uncommitted(self) -> bool:
        """True when the (current) session holds scheduled jobs not committed yet."""
        return self.session is not None and bool(self.session.info.get(UNCOMMITTED))

    def refuse_uncommitted(self, operation: str) -> None:
        """Raise :class:`NotConfigured` if the session holds jobs not committed yet."""
        if self.session is not None and self.session.info.get(UNCOMMITTED):
            raise NotConfigured(
                f"{operation}() runs in its own transaction, but db.session holds jobs "
                "scheduled and not committed yet: call db.session.commit() first"
            )
