"""Transaction policy: which transaction a flask_defer call writes in (no Flask here).

The product's promise is "the job commits with your change". With the app's
Flask-SQLAlchemy session, scheduling *joins* that session's transaction: the row
becomes real when the caller commits and disappears if it rolls back. Without a
session every call uses a short transaction of its *own*. Operations that decide a
race (cancel, reschedule, undo, prune, run_due) run in their own transaction by
default, and refuse to start while the session holds scheduled jobs that are not
committed yet (on SQLite they would wait for the session's write lock and then fail
with "database is locked"). With ``commit=False`` the control calls run in the
*caller's* transaction instead (:meth:`Transactions.control`): the guarded statement
decides the race at once and holds its lock until the caller commits or rolls back,
and their signals wait for that commit (:meth:`Transactions.after_commit`). An
*atomic* scope is the handler's session transaction, committed together with the
job's done mark.

One :class:`Transactions` is built per app at ``init_app`` from the session (or none)
and the store, and every caller goes through it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session, scoped_session

from ..errors import InvalidArgument, NotConfigured
from ..jobs import Fail
from . import JobStore
from .session_events import listen_once

#: Marks a session whose transaction holds scheduled jobs not yet committed.
UNCOMMITTED = "flask_defer.uncommitted"
#: Callbacks (signals of ``commit=False`` calls) to run once the session commits.
AFTER_COMMIT = "flask_defer.after_commit"

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
    """Drop the "uncommitted jobs" mark and unsent callbacks when the root transaction ends."""
    # Commit, rollback and close all end the root transaction. On commit the callbacks
    # already ran (after_commit comes first); on rollback they must never run.
    if transaction.parent is None:
        session.info.pop(UNCOMMITTED, None)
        session.info.pop(AFTER_COMMIT, None)


def run_after_commit(session: Session) -> None:
    """Run the callbacks queued by :meth:`Transactions.after_commit`, once, in order."""
    # Releasing a savepoint fires after_commit too; only the root commit makes it real.
    if session.in_nested_transaction():
        return
    for callback in session.info.pop(AFTER_COMMIT, ()):
        callback()


def track_uncommitted(session: scoped_session[Session]) -> None:
    """Clear the mark whenever the session's transaction ends (commit or rollback)."""
    # Not event.contains(): it can alias a collected Session class (see session_events).
    listen_once(session, "after_transaction_end", clear_uncommitted)
    listen_once(session, "after_commit", run_after_commit)
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
    def caller(self, operation: str) -> Iterator[Connection]:
        """The caller's transaction on ``db.session``, for a control call with ``commit=False``.

        Nothing is committed here, and the "uncommitted jobs" guard does not apply:
        this transaction is exactly where the caller wants the change. The guarded
        statement's lock (the row on PostgreSQL, the database's write lock on SQLite)
        is held until the caller commits or rolls back. The session is marked as
        holding uncommitted jobs, so a later call in a transaction of its own refuses
        instead of waiting for that lock. Without a session there is no caller's
        transaction to join: :class:`InvalidArgument` naming ``commit``.
        """
        if self.session is None:
            raise InvalidArgument(
                "commit",
                f"{operation}(commit=False) runs in db.session's transaction, but this "
                "app has no db (its jobs live in a database of their own): pass db to "
                "defer.init_app(app, db=db), or leave commit=True",
            )
        with self.joined(writes=True) as conn:
            yield conn

    def control(self, operation: str, *, commit: bool) -> AbstractContextManager[Connection]:
        """Where a control call decides its race: its own transaction, committed on exit
        (``commit=True``, refused while the session holds uncommitted jobs), or the
        caller's (``commit=False``, see :meth:`caller`)."""
        if not commit:
            return self.caller(operation)
        return self.own(operation)

    def hooked(self, operation: str, *, commit: bool) -> AbstractContextManager[Connection]:
        """Like :meth:`control`, but on ``db.session`` itself, where app hooks write.

        ``commit=True``: refused while uncommitted jobs are held, then the session's
        transaction is committed on exit (rolled back if a hook raises), as
        :meth:`atomic`. ``commit=False``: the caller's transaction, as :meth:`caller`;
        if a hook raises, nothing is rolled back here: the caller's transaction holds
        the cancel and the hooks' writes, and the caller rolls it back.
        """
        if not commit:
            return self.caller(operation)
        self.refuse_uncommitted(operation)
        return self.atomic()

    def after_commit(self, callback: Callable[[], None], *, commit: bool) -> None:
        """Call *callback* now (``commit=True``: already committed) or once the
        caller's transaction commits (``commit=False``); never after a rollback."""
        if commit or self.session is None:
            callback()
            return
        self.session.info.setdefault(AFTER_COMMIT, []).append(callback)

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
        """True when the (current) session holds scheduled jobs not committed yet.

        A scope with no session yet holds nothing: asking its ``info`` would create one
        (the worker asks after every job, most of which never touch ``db.session``).
        """
        session = self.session
        if session is None:
            return False
        registry = getattr(session, "registry", None)
        if registry is not None and not registry.has():
            return False
        return bool(session.info.get(UNCOMMITTED))

    def refuse_uncommitted(self, operation: str) -> None:
        """Raise :class:`NotConfigured` if the session holds jobs not committed yet."""
        if self.session is not None and self.session.info.get(UNCOMMITTED):
            raise NotConfigured(
                f"{operation}() runs in its own transaction, but db.session holds jobs "
                "scheduled and not committed yet: call db.session.commit() first"
            )
