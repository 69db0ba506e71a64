"""The store's foundation: the engine, transactions, and the shared SQL fragments."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Table,
    and_,
    bindparam,
    literal,
    literal_column,
    update,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import (
    DataError,
    DBAPIError,
    IntegrityError,
    InternalError,
    OperationalError,
    ProgrammingError,
    SQLAlchemyError,
)

from ..jobs import JobStatus
from .claim_sql import KEYED_MEMORY, ClaimTables
from .driver import Driver, make_driver
from .parts import StoreParts
from .records import SETTLING, HistoryEvent, JobFilter, NewJob
from .schema import (
    UTCDateTime,
    define_activity_table,
    define_dependencies_table,
    define_pauses_table,
    define_starts_table,
    define_workers_table,
    typed_jobs_table,
)
from .versioning import record_on_create

logger = logging.getLogger("flask_defer")

#: Markers in :data:`ACK_VALUES`: the statement's ``now``, or a ``v_<column>`` bind.
_NOW, _BIND = object(), object()

#: What each single acknowledgement sets besides clearing the claim (see
#: ``StoreBase._guarded_ack``): a status literal, ``now``, a bound value, or an int that
#: is added to ``attempts``.
ACK_VALUES: dict[str, dict[str, Any]] = {
    "done": {"status": "done", "finished_at": _NOW, "last_error": _BIND, "result": _BIND},
    "failed": {"status": "failed", "finished_at": _NOW, "last_error": _BIND},
    # A handler that stopped on an abort request (``defer.abort``).
    "aborted": {"status": "cancelled", "finished_at": _NOW, "last_error": _BIND},
    "retry": {"status": "pending", "run_at": _BIND, "last_error": _BIND},
    # Snoozed without spending the attempt; "snooze_due" also moves due_at (NotYet).
    "snooze": {"status": "pending", "run_at": _BIND, "attempts": -1, "last_error": _BIND},
    "snooze_due": {
        "status": "pending",
        "run_at": _BIND,
        "due_at": _BIND,
        "attempts": -1,
        "last_error": _BIND,
    },
    # Handed back unstarted: due now or at the old run_at, the claim's attempt given back.
    "release": {"status": "pending", "run_at": _NOW, "attempts": -1},
    "release_keep_run_at": {"status": "pending", "attempts": -1},
}


class StoreBase:
    """The engine and table, transactions, and the conditions every statement shares."""

    def __init__(
        self,
        engine: Engine,
        table: Table,
        history: Table | None = None,
        pauses: Table | None = None,
    ) -> None:
        # Long because: one attribute per prebuilt statement and setting, each with why.
        self.engine = engine
        #: Where the worker's LISTEN connects when it must not go through the app's
        #: engine (``DEFER_LISTEN_DATABASE_URI``, behind a transaction-mode pooler).
        self.listen_engine: Engine | None = None
        #: The paused queues and names (a typed copy); a bare store defines the table in
        #: its jobs table's metadata, so creating that metadata creates it too.
        pauses = pauses if pauses is not None else define_pauses_table(table.metadata, table.name)
        self.pauses_table = typed_jobs_table(pauses)
        #: The job dependencies (``after=``, groups), defined the same way.
        self.dependencies_table = typed_jobs_table(
            define_dependencies_table(table.metadata, table.name)
        )
        #: The rate-limited jobs' recent starts (``@defer.job(rate_limit=...)``).
        self.starts_table = typed_jobs_table(define_starts_table(table.metadata, table.name))
        #: The live workers (``defer.workers()``), one row per running worker.
        self.workers_table = typed_jobs_table(define_workers_table(table.metadata, table.name))
        #: Runs per minute and hour, by queue and name (``defer.activity()``).
        self.activity_table = typed_jobs_table(
            define_activity_table(table.metadata, table.name)
        )
        # Creating the table from the app's metadata (db.create_all()) or from the store
        # records the newest revision in the same transaction.
        record_on_create(table)
        # The statements run on a copy with aware-UTC types (see schema.typed_jobs_table).
        self.table = table = typed_jobs_table(table)
        record_on_create(table)
        #: The history table (a typed copy, like the jobs table's), or None when history
        #: is off (``DEFER_HISTORY = False``).
        self.history_table = typed_jobs_table(history) if history is not None else None
        self._quoted_table = engine.dialect.identifier_preparer.format_table(table)
        #: What differs between the databases (:mod:`.driver`): the only code here that
        #: knows which one this is.
        self.driver: Driver = make_driver(cast("StoreParts", self))  # JobStore has every part
        #: Jobs due further ahead than this send no NOTIFY (see ``wants_notify``); the
        #: extension sets it to ``DEFER_MAX_SLEEP``, the longest a worker sleeps.
        self.notify_horizon = timedelta(seconds=10)
        # The prebuilt portable statements of the claim's helpers (keyed probe, next
        # due), by (kind, with queues, limit).
        self._claim_sql: dict[tuple[str, bool, int | None], Any] = {}
        # The keyless job INSERT the drivers send (see SchedulingStatements.job_insert).
        self._job_insert: dict[
            tuple[Dialect, bool], tuple[str, list[str], list[tuple[int, Any]]]
        ] = {}
        # Keyed jobs (a concurrency_key) are claimed by a statement of their own, run
        # while keyed jobs were seen lately (monotonic deadlines; ClaimStatements).
        self._keyed_until = 0.0
        self._keyed_unseen_until = 0.0
        # The prebuilt single acknowledgements, by kind (see _guarded_ack), and the
        # other prebuilt control statements, by name.
        self._ack_one_sql: dict[str, Any] = {}
        self._control_sql: dict[str, Any] = {}
        # The prebuilt batch statements (BatchStatements), by variant.
        self._batch_sql: dict[tuple[str, bool, bool, bool], Any] = {}

    @property
    def quoted_table(self) -> str:
        """The jobs table's name as the SQL text writes it."""
        return self._quoted_table

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A short transaction of the store's own, committed on success."""
        with self.engine.begin() as conn:
            yield conn

    def autocommit(self) -> AbstractContextManager[Connection]:
        """A connection where each statement is its own transaction (PostgreSQL).

        For the worker's single-statement writes (claim, batched acknowledgement): no
        BEGIN and COMMIT round trips around the one statement that does the work. How
        the connection is switched is the driver's (``Driver.autocommit``).
        """
        return self.driver.autocommit()

    def keeping_connections(self) -> AbstractContextManager[None]:
        """For the block, the calling thread keeps its autocommit connection (claims,
        batched acknowledgements) from one statement to the next while it writes
        often, instead of taking the pool's next one each time: on PostgreSQL each
        connection plans a statement anew until it has prepared it (see
        ``store/postgres/kept.py``). For the worker's loop and its flusher."""
        return self.driver.keeping_connections()

    def begin_immediate(self) -> AbstractContextManager[Connection]:
        """A write transaction that takes the write lock up front, where there is one.

        On SQLite a deferred transaction that reads first and writes later can fail
        with "database is locked" without waiting; this one waits for the lock (busy
        timeout) instead, in turn with this process's other writers. PostgreSQL
        needs nothing special (the driver's ``write_transaction``).
        """
        return self.driver.write_transaction()

    def create_table(self, *, history: bool = True) -> None:
        """Create the tables and indexes if they do not exist (``flask defer install``).

        ``history=False`` creates the jobs table alone: ``build_state`` creates the history
        and pauses tables only where the schema is at the newest revision, so an older
        schema's upgrade can.
        """
        self.table.create(self.engine, checkfirst=True)
        if history:
            self.pauses_table.create(self.engine, checkfirst=True)
            self.dependencies_table.create(self.engine, checkfirst=True)
            self.starts_table.create(self.engine, checkfirst=True)
            self.workers_table.create(self.engine, checkfirst=True)
            self.activity_table.create(self.engine, checkfirst=True)
        if history and self.history_table is not None:
            self.history_table.create(self.engine, checkfirst=True)

    @property
    def keeps_history(self) -> bool:
        """True when this store records job history (``DEFER_HISTORY``)."""
        return self.history_table is not None

    def record_events(self, conn: Connection, events: Sequence[HistoryEvent]) -> None:
        """Insert *events* in *conn*'s transaction: one statement for the whole list."""
        if self.history_table is None or not events:
            return
        self.driver.record_events(conn, events)

    def notify(self, conn: Connection, queue: str) -> None:
        """Wake listening workers when the caller's transaction commits (where they listen)."""
        self.driver.notify(conn, queue)

    def wants_notify(self, run_at: datetime, now: datetime) -> bool:
        """Whether a job due at *run_at* must wake the workers when it commits.

        A listening worker never sleeps longer than ``notify_horizon`` (its
        ``DEFER_MAX_SLEEP``) without looking at the earliest ``run_at`` again, so a job
        due later than that is found by that look in time and its NOTIFY would only
        cost the commit a lock on the notification queue and every worker a wake-up.
        """
        return run_at <= now + self.notify_horizon

    def keyed_scheduled(self) -> None:
        """Keyed jobs are about (this process scheduled one, or a claim took some): the
        claims run the keyed statement for a while without looking first."""
        self._keyed_until = time.monotonic() + KEYED_MEMORY

    def claim_tables(self) -> ClaimTables:
        """The names the claim statements use, with the driver's index hints."""
        name = self.table.name
        return ClaimTables(
            jobs=self._quoted_table,
            unkeyed_hint=self.driver.index_hint(f"ix_{name}_pending_priority"),
            keyed_hint=self.driver.index_hint(f"ix_{name}_keyed_pending"),
            pauses=self.engine.dialect.identifier_preparer.format_table(self.pauses_table),
            starts=self.engine.dialect.identifier_preparer.format_table(self.starts_table),
        )

    def _is_pending(self) -> ColumnElement[bool]:
        # A literal, not a bound parameter: only a query whose WHERE visibly says
        # status = 'pending' may use the partial indexes on pending rows (SQLite always,
        # PostgreSQL in generic plans of prepared statements).
        return self.table.c.status == literal_column("'pending'")

    def refuses_values(self, error: SQLAlchemyError) -> bool:
        """Whether the database refused a write for what it holds (a constraint or a
        trigger of the app's, a value out of range or too large, a table that does not
        fit the statement) rather than for its own state (gone, locked, full, out of
        connections), so that the same write would fail the same way however often it
        is retried. PEP 249 sorts most of them so: the state's errors are
        ``OperationalError`` and ``InterfaceError``; an app trigger's ``RAISE`` is
        ``IntegrityError`` on SQLite and ``ProgrammingError`` on PostgreSQL. The driver
        knows the rest (:meth:`Driver.past_a_limit`)."""
        if not isinstance(error, DBAPIError) or error.connection_invalidated:
            return False
        if isinstance(error, IntegrityError | DataError | InternalError | ProgrammingError):
            return True
        return self.driver.past_a_limit(error)

    def refuses_for_size(self, error: SQLAlchemyError) -> bool:
        """Whether the database refused a write for a value's size (past its length
        limit): a handler's result too large to store, say."""
        return (
            isinstance(error, DBAPIError)
            and not error.connection_invalidated
            and self.driver.too_large(error)
        )

    def _lost_pending_index(self, error: OperationalError) -> bool:
        """After "no such index" (a database migrated without it), stop naming it."""
        if not self.driver.lost_index(error):
            return False
        self._claim_sql.clear()
        return True

    def _guarded_ack(self, kind: str) -> Any:
        """``UPDATE ... WHERE id = :job_id AND status = 'running' AND claim_token =
        :token`` setting the values of *kind* (:data:`ACK_VALUES`), built once per store.

        Prebuilt like the claim and the batched acknowledgement: building an UPDATE and
        its cache key costs more than running it on SQLite. Binds: ``job_id``,
        ``token``, ``now`` and the ``v_*`` values of *kind*. A ``release*`` kind keeps
        nothing of the claim; every kind clears the claim token and lease.
        """
        cached = self._ack_one_sql.get(kind)
        if cached is not None:
            return cached
        t = self.table
        now = bindparam("now", type_=UTCDateTime())
        values: dict[str, Any] = {}
        for name, value in ACK_VALUES[kind].items():
            if value is _NOW:
                values[name] = now
            elif value is _BIND:
                values[name] = bindparam(f"v_{name}", type_=t.c[name].type)
            elif isinstance(value, int):
                values[name] = t.c.attempts + value
            else:
                values[name] = literal_column(f"'{value}'")
        values.update(claim_token=None, lease_expires_at=None, updated_at=now)
        stmt = (
            update(t)
            .where(
                t.c.id == bindparam("job_id", type_=t.c.id.type),
                t.c.status == literal_column(f"'{JobStatus.RUNNING.value}'"),
                t.c.claim_token == bindparam("token", type_=t.c.claim_token.type),
            )
            .values(values)
        )
        if kind == "aborted":
            # Its children, and who asked for the abort (its event names them).
            stmt = stmt.returning(t.c.dependents, t.c.abort_requested_by)
        elif ACK_VALUES[kind]["status"] in SETTLING:
            # Whether the settled job has children to release (see store.dependencies).
            stmt = stmt.returning(t.c.dependents)
        self._ack_one_sql[kind] = stmt
        return stmt

    @staticmethod
    def _settle_values(status: JobStatus, now: datetime) -> dict[str, Any]:
        return {
            "status": status.value,
            "finished_at": now,
            "updated_at": now,
            "lease_expires_at": None,
            "claim_token": None,
        }

    def _identity(self, job_id: int | None, key: str | None) -> ColumnElement[bool]:
        t = self.table
        if job_id is not None:
            return t.c.id == job_id
        return t.c.key == key

    def _filter(self, where: JobFilter) -> ColumnElement[bool]:
        """Every condition *where* sets, ANDed (``TRUE`` when it sets none): the filter
        of ``list``, ``count`` and the bulk cancel and retry, so every caller filters
        alike. A key prefix matches exactly, case and wildcards included."""
        t = self.table
        conditions: list[ColumnElement[bool]] = []
        if where.statuses:
            conditions.append(t.c.status.in_([s.value for s in where.statuses]))
        if where.name is not None:
            conditions.append(t.c.name == where.name)
        if where.owner is not None:
            conditions.append(t.c.owner == where.owner)
        if where.queue is not None:
            conditions.append(t.c.queue == where.queue)
        if where.key_prefix is not None:
            conditions.append(self.driver.key_startswith(t, where.key_prefix))
        return and_(literal(True), *conditions)

    @staticmethod
    def row_values(new: NewJob, now: datetime) -> dict[str, Any]:
        """The column values of a new job's row, in the table's column order (the
        prebuilt inserts bind their placeholders in this order)."""
        return {
            "name": new.name,
            "queue": new.queue,
            "key": new.key,
            "payload": new.payload,
            "status": JobStatus.PENDING.value,
            "run_at": new.run_at,
            "due_at": new.run_at,
            "attempts": 0,
            "max_attempts": new.max_attempts,
            "owner": new.owner,
            "label": new.label,
            "waiting_label": new.waiting_label,
            "done_label": new.done_label,
            "failed_label": new.failed_label,
            "undone_label": new.undone_label,
            "undo_until": new.undo_until,
            "created_at": now,
            "updated_at": now,
            "priority": new.priority,
            "concurrency_key": new.concurrency_key,
            "concurrency_limit": new.concurrency_limit,
            "expires_at": new.expires_at,
            "rate_limit": new.rate_limit,
            "rate_period": new.rate_period,
        }
