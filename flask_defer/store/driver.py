"""What really differs between SQLite and PostgreSQL, said once: the driver Protocol.

The store's statements are portable SQLAlchemy Core and plain SQL wherever the two
databases agree. Where they do not, the store asks its driver, which is the only code
that knows which database it talks to:

* how a write begins (SQLite's single write lock, taken in turn; nothing on
  PostgreSQL, whose rows lock themselves) and how the claim runs (``UPDATE ...
  RETURNING`` under that lock without an fsync; ``FOR UPDATE SKIP LOCKED`` in one
  autocommit statement, keyed claims serialised by an advisory lock);
* the hot inserts and the batched acknowledgement (a driver cursor and positional
  tuples; one statement over arrays, history events riding in CTEs);
* ``INSERT ... ON CONFLICT DO NOTHING``, JSON list appends, row locks that skip,
  index hints, the maintenance lock, wake-ups (``LISTEN``/``NOTIFY`` or a poll);
* capabilities the code above asks instead of a database's name:
  :attr:`Driver.serialises_writes`, :attr:`Driver.notifies`,
  :attr:`Driver.can_listen`, :attr:`Driver.events_in_statement`.

:func:`driver_class` is the one place that picks the driver, from the engine's
dialect. Each driver lives in its own package (:mod:`.sqlite`, :mod:`.postgres`), and
one conformance suite (``tests/store``) runs every store test on both.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, ClassVar, Protocol

from sqlalchemy import ColumnElement, Connection, Dialect, Engine, Select, Table
from sqlalchemy.exc import DBAPIError, OperationalError

from ..jobs import Job
from .parts import StoreParts
from .postgres import PostgresDriver
from .records import Ack, BatchItems, HistoryEvent, NewJob
from .sqlite import SqliteDriver

__all__ = ["Driver", "driver_class", "make_driver"]


class Driver(Protocol):
    """Everything the store does differently on one database (see the module doc)."""

    #: The database's name as SQLAlchemy's dialect spells it: for messages and logs.
    name: ClassVar[str]
    #: One writer at a time (SQLite): writes take the database's lock and rows are
    #: never locked one by one, so "skip rows others hold" has nothing to skip.
    serialises_writes: ClassVar[bool]
    #: The database can wake listening workers (``NOTIFY``) when a transaction commits.
    notifies: ClassVar[bool]
    #: History events ride in the statement that changes the row (CTEs).
    events_in_statement: ClassVar[bool]

    @property
    def can_listen(self) -> bool:
        """Workers can be woken by ``NOTIFY`` (PostgreSQL through psycopg 3)."""

    @property
    def listen_unavailable(self) -> str | None:
        """Why this database could wake workers but this connection cannot, if so."""

    @staticmethod
    def prepare_engine(
        engine: Engine, busy_timeout: timedelta, synchronous: str | None = None
    ) -> None:
        """Tune an app's engine once, before any connection is used (SQLite: the busy
        timeout and ``PRAGMA synchronous``)."""

    # -- transactions -------------------------------------------------------------

    def write_transaction(self) -> AbstractContextManager[Connection]:
        """A short write transaction that takes the write lock up front."""

    def begin_write(self, conn: Connection) -> None:
        """Open *conn*'s write transaction, taking the write lock where there is one."""

    def autocommit(self) -> AbstractContextManager[Connection]:
        """A pooled connection where each statement commits on its own, switched back
        before it returns to the pool."""

    def keeping_connections(self) -> AbstractContextManager[None]:
        """For the block, the calling thread keeps its :meth:`autocommit` connection
        between statements while it is busy (a worker's loop and flusher)."""

    # -- statements ---------------------------------------------------------------

    def insert_ignoring(self, table: Table) -> Any:
        """``insert(table)`` with ``.on_conflict_do_nothing(...)`` available."""

    def index_hint(self, index_name: str) -> str:
        """Text that makes a query read *index_name* (``""`` where not needed)."""

    def lost_index(self, error: OperationalError) -> bool:
        """After a "no such index" error: stop naming indexes; True if that was it."""

    def past_a_limit(self, error: DBAPIError) -> bool:
        """The database refused a statement at one of its own limits (a value or a
        statement too large) and reported it under an error class that PEP 249 keeps
        for its state, so the same write would fail the same way however often it is
        retried."""

    def too_large(self, error: DBAPIError) -> bool:
        """The database refused a value for its size (past its length limit)."""

    def key_startswith(self, table: Table, prefix: str) -> ColumnElement[bool]:
        """``key`` starts with *prefix* exactly (case and wildcards included)."""

    def ids_in(self, column: Any, ids: Sequence[int]) -> ColumnElement[bool]:
        """*column* is one of *ids* (many: a thousand children of a parent)."""

    def skip_locked(self, select: Select[Any]) -> Select[Any]:
        """*select* passing over rows another transaction holds (where rows lock)."""

    def lock_batch_key(self, conn: Connection, lock_name: str) -> None:
        """Serialise appends to one batch key for the rest of *conn*'s transaction."""

    def lock_in_order(self, conn: Connection, table: Table, ids: Sequence[int]) -> None:
        """Lock the rows of *ids* for update, in id order, for the rest of *conn*'s
        transaction (where rows lock): two transactions that then update overlapping
        sets one statement at a time, in whatever order, cannot deadlock."""

    def batch_items(self, table: Table, item_json: ColumnElement[str]) -> BatchItems:
        """The JSON expressions of appending *item_json* (the item as JSON text, a bound
        parameter) to a batch row."""

    @property
    def null_time(self) -> str:
        """A NULL timestamp as a UNION's column (typed where the database needs it)."""

    # -- the hot paths ------------------------------------------------------------

    def record_events(self, conn: Connection, events: Sequence[HistoryEvent]) -> None:
        """Insert history events in *conn*'s transaction, in one statement."""

    def notify(self, conn: Connection, queue: str) -> None:
        """Wake listening workers when *conn*'s transaction commits (or nothing)."""

    def lower_waiting(
        self, conn: Connection, children: Sequence[int], closed: int, *, now: datetime, actor: str
    ) -> list[tuple[int, str, datetime]]:
        """Lower the ``waiting_for`` of each pending child in *children* by *closed*
        edges, releasing those it brings to zero (due from their ``run_at`` or *now*,
        whichever is later) with their ``released`` events; the released children's
        ``(id, queue, run_at)``."""

    def insert_one(
        self,
        conn: Connection,
        values: dict[str, Any],
        *,
        notify: bool,
        actor: str,
        payload_json: str | None,
        keyed: bool = False,
    ) -> int | None:
        """The insert of one job and its ``scheduled`` event; its id. With *keyed*, the
        job has a key: a live job holding it means no row, no event and None."""

    def insert_many(
        self, conn: Connection, jobs: Sequence[NewJob], *, now: datetime, actor: str
    ) -> None:
        """Many keyless jobs and their ``scheduled`` events in the caller's transaction."""

    def claim(self, params: dict[str, Any], *, queues: bool, actor: str) -> list[Job]:
        """Start up to ``params["limit"]`` due jobs (keyed ones first) and return them."""

    def acknowledge_many(self, acks: Sequence[Ack], now: datetime, actor: str) -> set[int]:
        """Write a batch of outcomes (compare-and-set per row); the ids still owned."""

    def maintenance_lock(self) -> AbstractContextManager[bool]:
        """True in the one process that may reclaim and prune right now."""

    def open_listener(self) -> Any:
        """A dedicated connection LISTENing for new jobs (and the self-test channel)."""

    def probe_listener(self, token: str) -> None:
        """Send the listener's self-test notification, carrying *token*."""


def driver_class(dialect: Dialect) -> type[SqliteDriver] | type[PostgresDriver]:
    """The driver of *dialect*: the one place that looks at a database's name."""
    if dialect.name == "sqlite":
        return SqliteDriver
    if dialect.name == "postgresql":
        return PostgresDriver
    raise ValueError(f"flask_defer supports SQLite and PostgreSQL, not {dialect.name!r}")


def make_driver(store: StoreParts) -> Driver:
    """The driver of *store*'s engine, bound to *store*."""
    driver: Driver = driver_class(store.engine.dialect)(store)
    return driver
