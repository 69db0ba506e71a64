"""SQLite's write lock, taken in turn rather than by lottery.

SQLite lets one writer in at a time, and a writer that finds the lock taken waits in
its busy handler: it sleeps 1, 2, 5, 10 ... and then 100 ms between looks. A writer
that has waited a while therefore looks ten times a second, while one that just
committed and comes straight back (a busy batch key's producers, the worker's next
claim) takes the lock again between those looks. Under a steady stream of short
writes the unlucky writer waited for seconds, although no transaction held the lock
for longer than a few tens of milliseconds (measured: batch appends waiting 2.1-3.1 s
beside a worker whose longest write transaction took 26-51 ms), and the worker's own
claim waited as long, so due batches started seconds late.

:class:`WriteLock` takes the lock with ``BEGIN IMMEDIATE`` instead, for every write
transaction on an engine flask_defer tunes (:func:`take_turns_to_write`: the app's
own writes too) and for the store's ``begin_immediate`` (:func:`begin_write`), and

- queues this process's writers first-come first-served: only the writer at the
  head of the queue looks for SQLite's lock, the others wait their turn without
  polling, and a writer that comes straight back joins the end of the queue;
- lets the head look every :data:`POLL_INTERVAL` (with SQLite's own busy handler
  switched off for those looks), so a lock freed by another process (the worker, a
  web process) is taken within about a millisecond, not a hundred.

- keeps its turn until its transaction ends (commit or rollback, :func:`hand_over_at_end`),
  so within one process the lock passes straight from a writer to the next: no look
  is spent on a lock this process holds itself. Polling only ever waits for another
  process (measured: a worker whose four threads each polled every 1 ms for the lock
  their neighbour held drained 470 jobs/s, against 860 with SQLite's own handler).

A writer therefore waits for the transaction that holds the lock, the writers of its
process queued before it, and what other processes' writers slip in between its
looks; never longer than the connection's busy timeout, after which it fails with
"database is locked" as before.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine

from ..watching import sqlalchemy_error

#: Seconds between two looks for SQLite's write lock by the writer at the head.
POLL_INTERVAL = 0.001
#: Seconds between two checks, by a queued writer, that the writer holding this
#: process's turn is still in its transaction (one that ended without the hand-over,
#: say by a raw ``COMMIT`` or a closed connection, gives the turn up then).
STALE_CHECK = 0.01
#: How long a holder must look finished before its turn is taken from it. SQLite
#: reports a connection out of its transaction as soon as COMMIT begins, while the
#: commit (its fsync) still holds the lock, so a single look is no proof: under load
#: queued writers took the turn mid-commit and found the lock still taken.
STALE_GRACE = 0.2

_BEGIN = "BEGIN IMMEDIATE"
#: Why a thread's second write transaction is refused while its first is open.
SELF_WAIT = (
    "database is locked by this same thread: it holds SQLite's write lock in another "
    "open transaction (an uncommitted db.session write?), and waiting here would wait "
    "for itself. Commit or roll back that transaction first, or pass commit=False to "
    "make the change in it"
)
#: Where :func:`begin_write` keeps a connection's busy timeout (its pool record's info).
_BUSY_MS = "flask_defer.busy_timeout_ms"


class FairLock:
    """A first-come first-served lock: released, it passes straight to the oldest waiter.

    ``threading.Lock`` makes no promise of order, and a thread that releases it and
    asks again at once usually wins; this one hands itself over instead.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._waiters: deque[threading.Lock] = deque()
        self._held = False

    def acquire(self, timeout: float, stale: Callable[[], None] | None = None) -> bool:
        """Wait up to *timeout* seconds for this lock, in arrival order; True if taken.

        *stale*, if given, is called every :data:`STALE_CHECK` seconds of the wait, so
        the holder can be found gone (and the lock released for it) without anybody
        losing their place in the queue.
        """
        with self._mutex:
            if not self._held:
                self._held = True
                return True
            turn = threading.Lock()
            turn.acquire()
            self._waiters.append(turn)
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            wait = deadline - time.monotonic()
            if stale is not None:
                wait = min(wait, STALE_CHECK)
            if turn.acquire(timeout=max(wait, 0.0)):
                return True
            if time.monotonic() >= deadline:
                break
            if stale is not None:
                stale()
        with self._mutex:
            try:
                self._waiters.remove(turn)
            except ValueError:
                return True  # handed over just as the wait ran out: it is ours
            return False

    def release(self) -> None:
        """Hand the lock to the oldest waiter, or free it if none waits."""
        with self._mutex:
            if self._waiters:
                self._waiters.popleft().release()  # still held: now by that waiter
            else:
                self._held = False


class WriteLock:
    """Takes SQLite's write lock for one engine's connections, in turn (module docs)."""

    def __init__(self) -> None:
        self._turns = FairLock()
        self._mutex = threading.Lock()
        #: This process's connection whose write transaction holds the turn, if any.
        self._holder: sqlite3.Connection | None = None
        #: When the holder was first seen out of its transaction (see STALE_GRACE).
        self._finished_since: float | None = None
        #: The thread that took the turn for the holder.
        self._holder_thread: int | None = None

    def begin(self, dbapi: sqlite3.Connection, busy_ms: int | None = None) -> None:
        """``BEGIN IMMEDIATE`` on *dbapi*, waiting in turn for the lock.

        Waits at most *busy_ms* (default: the connection's ``PRAGMA busy_timeout``),
        then raises :class:`sqlite3.OperationalError` ("database is locked") as SQLite
        would. Any other error (a stale read snapshot, which no wait can cure) is
        raised at once. On success the turn stays with *dbapi* until its transaction
        ends (:meth:`ended`).

        A thread that already holds the turn on another connection of its own, in an
        open transaction, would wait for itself: that is refused at once, saying so
        (an uncommitted ``db.session`` write followed by a call that opens a
        transaction of its own), rather than after the busy timeout.
        """
        # The holder and its thread read together: a writer taking the turn sets them in
        # two steps, and between them this thread (the last holder) read the new holder
        # with its own, old, thread and refused a wait that was not on itself.
        with self._mutex:
            holder, holder_thread = self._holder, self._holder_thread
        if (
            holder is not None
            and holder is not dbapi
            and holder_thread == threading.get_ident()
            and _in_transaction(holder)
        ):
            raise sqlite3.OperationalError(SELF_WAIT)
        if busy_ms is None:
            (busy_ms,) = dbapi.execute("PRAGMA busy_timeout").fetchone()
        deadline = time.monotonic() + busy_ms / 1000
        if not self._turns.acquire(deadline - time.monotonic(), self._release_if_stale):
            # Out of time in this process's queue: one look without waiting, which fails
            # as SQLite does (the lock is held in this process, often by the same thread
            # on another connection) or, if it was just let go, takes it.
            dbapi.execute("PRAGMA busy_timeout = 0")
            try:
                dbapi.execute(_BEGIN)
            finally:
                dbapi.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
            return
        # Tried at once with SQLite's own busy handler off: the usual case, no other
        # process holds the lock, costs this one statement and two PRAGMAs.
        dbapi.execute("PRAGMA busy_timeout = 0")
        try:
            while not _try_begin(dbapi):
                if time.monotonic() >= deadline:
                    dbapi.execute(_BEGIN)  # raises "database is locked"
                    break
                time.sleep(POLL_INTERVAL)  # another process writes: look again soon
        except BaseException:
            self._turns.release()
            raise
        finally:
            dbapi.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
        with self._mutex:
            self._holder = dbapi
            self._holder_thread = threading.get_ident()
            self._finished_since = None
        _holding[id(dbapi)] = self

    def ended(self, dbapi: Any) -> None:
        """*dbapi*'s transaction ended: pass the turn to the next writer, if it held it."""
        with self._mutex:
            if self._holder is not dbapi:
                return
            self._holder = None
        _holding.pop(id(dbapi), None)
        self._turns.release()

    def _release_if_stale(self) -> None:
        """Give up the turn of a holder whose transaction ended without :meth:`ended`.

        Only once it has looked finished for :data:`STALE_GRACE`: a commit in progress
        looks finished too, and ends with :meth:`ended` by itself.
        """
        holder = self._holder
        if holder is None:
            return
        if _in_transaction(holder):
            self._finished_since = None
            return
        now = time.monotonic()
        if self._finished_since is None:
            self._finished_since = now
        elif now - self._finished_since >= STALE_GRACE:
            self.ended(holder)


#: Connections holding their engine's turn, by ``id()``: how a commit finds its lock.
_holding: dict[int, WriteLock] = {}


def transaction_ended(connection: Any) -> None:
    """Hand the turn on after *connection*'s COMMIT or ROLLBACK (a no-op if it held none)."""
    dbapi = getattr(connection, "dbapi_connection", connection)
    lock = _holding.get(id(dbapi))
    if lock is not None and not _in_transaction(dbapi):
        lock.ended(dbapi)


def hand_over_at_end(dialect: Any) -> None:
    """Make *dialect*'s commit and rollback hand the write turn on once they are done.

    SQLAlchemy's commit and rollback events fire before the driver's call, and a
    writer let in then would find SQLite's lock still taken; so the dialect's own
    ``do_commit`` and ``do_rollback`` (which the pool's reset-on-return uses too) are
    wrapped, once per dialect.
    """
    if getattr(dialect, "_flask_defer_hands_over", False):
        return
    commit, rollback = dialect.do_commit, dialect.do_rollback

    def do_commit(connection: Any) -> None:
        try:
            commit(connection)
        finally:
            transaction_ended(connection)

    def do_rollback(connection: Any) -> None:
        try:
            rollback(connection)
        finally:
            transaction_ended(connection)

    dialect.do_commit, dialect.do_rollback = do_commit, do_rollback
    dialect._flask_defer_hands_over = True


def _in_transaction(dbapi: Any) -> bool:
    """Whether *dbapi* is in a transaction; a closed connection is not."""
    try:
        return bool(dbapi.in_transaction)
    except sqlite3.ProgrammingError:
        return False


_locks: weakref.WeakKeyDictionary[Engine, WriteLock] = weakref.WeakKeyDictionary()
_locks_mutex = threading.Lock()


def write_lock_of(engine: Engine) -> WriteLock:
    """The one :class:`WriteLock` of *engine* in this process."""
    with _locks_mutex:
        lock = _locks.get(engine)
        if lock is None:
            lock = _locks[engine] = WriteLock()
            hand_over_at_end(engine.dialect)
        return lock


def begin_write(conn: Connection) -> None:
    """Start *conn*'s transaction by taking SQLite's write lock in turn (``BEGIN IMMEDIATE``).

    For transactions that may read before they write (the store's
    ``begin_immediate``). Nothing when the database connection is already in a
    transaction. Raises SQLAlchemy's ``OperationalError`` ("database is locked")
    after the busy timeout, like any statement.
    """
    dbapi = conn.connection.dbapi_connection
    if not isinstance(dbapi, sqlite3.Connection) or dbapi.in_transaction:
        return
    if conn.get_transaction() is None:
        conn.begin()  # SQLAlchemy's side of it; pysqlite sends no BEGIN of its own
    # The connection's busy timeout, read once per connection: every enqueue takes the
    # lock this way, and the read was one of its four statements.
    info = conn.connection.info
    busy_ms = info.get(_BUSY_MS)
    if busy_ms is None:
        (busy_ms,) = dbapi.execute("PRAGMA busy_timeout").fetchone()
        info[_BUSY_MS] = busy_ms
    try:
        write_lock_of(conn.engine).begin(dbapi, busy_ms)
    except sqlite3.Error as error:
        raise sqlalchemy_error(conn, _BEGIN, None, error) from error


def take_turns_to_write(engine: Engine, busy_timeout_ms: int) -> None:
    """Make every write transaction on *engine* take the write lock in turn.

    pysqlite opens a (deferred) transaction just before the first INSERT, UPDATE,
    DELETE or REPLACE on a connection that is not in one; that statement then waits
    for the write lock in SQLite's busy handler. The engine's dialect opens it a moment
    earlier as ``BEGIN IMMEDIATE`` through :class:`WriteLock`, the same transaction
    with a fair wait. So the app's own writes (a ``db.session.flush()`` before
    ``defer.batch``), the batch append and the worker's writes all queue alike.
    Connections in autocommit (``isolation_level=None``) are left alone.

    The dialect's ``do_execute``, ``do_executemany`` and ``do_execute_no_params`` are
    wrapped (once per dialect, as :func:`hand_over_at_end` wraps its commit), not a
    ``before_cursor_execute`` listener added: any listener on an engine makes
    SQLAlchemy join the engine's events into every connection it opens and dispatch
    them at every statement, which cost each write transaction of the app more than
    taking the lock did (profiled). Its error is the driver's, which SQLAlchemy turns
    into its own naming the statement, as for any statement.
    """
    dialect: Any = engine.dialect
    if getattr(dialect, "_flask_defer_takes_turns", False):
        return
    lock = write_lock_of(engine)

    def take_turn(cursor: Any, statement: str) -> None:
        dbapi = cursor.connection
        if (
            isinstance(dbapi, sqlite3.Connection)
            and not dbapi.in_transaction
            and dbapi.isolation_level is not None
            and _is_dml(statement)
        ):
            lock.begin(dbapi, busy_timeout_ms)

    execute, executemany = dialect.do_execute, dialect.do_executemany
    execute_no_params = dialect.do_execute_no_params

    def do_execute(cursor: Any, statement: str, parameters: Any, context: Any = None) -> None:
        take_turn(cursor, statement)
        execute(cursor, statement, parameters, context)

    def do_executemany(
        cursor: Any, statement: str, parameters: Any, context: Any = None
    ) -> None:
        take_turn(cursor, statement)
        executemany(cursor, statement, parameters, context)

    def do_execute_no_params(cursor: Any, statement: str, context: Any = None) -> None:
        take_turn(cursor, statement)
        execute_no_params(cursor, statement, context)

    dialect.do_execute, dialect.do_executemany = do_execute, do_executemany
    dialect.do_execute_no_params = do_execute_no_params
    dialect._flask_defer_takes_turns = True


def _is_dml(statement: str) -> bool:
    """The statements before which pysqlite opens a transaction by itself."""
    return statement.lstrip()[:7].upper().startswith(_DML)


_DML = ("INSERT", "UPDATE", "DELETE", "REPLACE")


def _try_begin(dbapi: Any) -> bool:
    """One look: True if ``BEGIN IMMEDIATE`` took the lock, False if it is taken."""
    try:
        dbapi.execute(_BEGIN)
    except sqlite3.OperationalError as error:
        if getattr(error, "sqlite_errorcode", sqlite3.SQLITE_BUSY) != sqlite3.SQLITE_BUSY:
            raise
        return False
    return True
