"""The SQLite driver: one writer at a time, taken in turn, and statements run in-process.

SQLite lets one transaction write at a time and runs every statement inside this
process, so its costs are the opposite of PostgreSQL's: a statement costs no round
trip, and Python around it is most of the time. Hence:

* every write transaction starts with ``BEGIN IMMEDIATE`` through a fair, in-process
  queue (:mod:`.write_lock`), the app's own writes too (:meth:`SqliteDriver.
  prepare_engine`, which also turns on WAL and the busy timeout);
* the hot inserts run the compiled statement on the driver's cursor with positional
  tuples (:mod:`.tuples`), and history events are a second local statement;
* the claim is ``UPDATE ... RETURNING`` inside that lock, naming its index
  (``INDEXED BY``: without statistics the planner would walk every pending row), run
  on sqlite3's own connection, and commits without an fsync; a batch of outcomes
  waits for its fsync after handing the lock on (:mod:`.durability`);
* rows are never locked one by one, so "skip locked rows" and advisory locks have
  nothing to do, and there is no ``LISTEN``: idle workers poll an indexed query.

Over 400 lines because it is one database's whole side of the store, its hot paths
side by side with the reasons for their shape (each was profiled); the write lock,
the tuple inserts and the durability of commits, ideas of their own, have modules of
their own.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from datetime import datetime, timedelta
from typing import Any, ClassVar, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Select,
    Table,
    bindparam,
    case,
    event,
    func,
    insert,
    literal_column,
    update,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError

from ...jobs import Job
from ..chunking import runs_by_size
from ..claim_sql import QUEUES_JSON, due_ids_sql, keyed_ids_sql
from ..parts import StoreParts, insert_values
from ..records import SETTLING, Ack, BatchItems, HistoryEvent, NewJob
from ..utc_datetime import UTCDateTime
from ..watching import sqlalchemy_error, watched
from .durability import sync_file, wal_file, without_flush_wait
from .tuples import Prepared, insert_statement
from .write_lock import begin_write, take_turns_to_write

logger = logging.getLogger("flask_defer")



class SqliteDriver:
    """The store's SQLite side (see the module's docstring and :mod:`..driver`)."""

    name: ClassVar[str] = "sqlite"
    serialises_writes: ClassVar[bool] = True
    notifies: ClassVar[bool] = False
    events_in_statement: ClassVar[bool] = False
    can_listen = False
    listen_unavailable = None
    null_time = "NULL"

    def __init__(self, store: StoreParts) -> None:
        self.store = store
        # Index hints hold until a database is found without the index (not migrated).
        self.hints = True
        # Compiled one-row INSERTs for insert_statement, by column set.
        self._tuples: Prepared = {}
        # Prebuilt statements, by name.
        self._sql: dict[Any, Any] = {}
        dialect = store.engine.dialect
        self._time = UTCDateTime().dialect_impl(dialect).bind_processor(dialect)

    # -- the engine ---------------------------------------------------------------

    @staticmethod
    def prepare_engine(
        engine: Engine, busy_timeout: timedelta, synchronous: str | None = None
    ) -> None:
        """WAL lets the web read while the worker writes; the busy timeout makes writers
        wait; every write transaction takes the lock in turn (:mod:`.write_lock`);
        *synchronous* (``DEFER_SQLITE_SYNCHRONOUS``) sets how commits reach the disk."""
        busy_ms = int(busy_timeout.total_seconds() * 1000)

        def on_connect(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
                if engine.url.database not in (None, "", ":memory:"):
                    cursor.execute("PRAGMA journal_mode = WAL")
                if synchronous is not None:  # one of config.SQLITE_SYNCHRONOUS, checked
                    cursor.execute(f"PRAGMA synchronous = {synchronous}")
            finally:
                cursor.close()

        event.listen(engine, "connect", on_connect)
        take_turns_to_write(engine, busy_ms)
        # Connections opened before init_app (if any) are replaced so all get the pragmas.
        engine.pool.dispose()

    def stored_time(self, value: datetime | None) -> Any:
        """*value* in the form the table stores it (None stays None)."""
        if value is None:
            return None
        process = self._time
        return process(value) if process is not None else value

    # -- transactions -------------------------------------------------------------

    @contextmanager
    def write_transaction(self) -> Iterator[Connection]:
        """``BEGIN IMMEDIATE``, in turn with this process's other writers.

        A deferred transaction that reads first and writes later can fail with
        "database is locked" without waiting; this one waits for the lock (busy
        timeout) instead.
        """
        with self.store.engine.connect() as conn, _written(conn):
            yield conn

    @contextmanager
    def durable_write(self) -> Iterator[Connection]:
        """:meth:`write_transaction` whose commit is on disk when the block is left, yet
        holds the write lock only until SQLite has the commit, not while the disk writes.

        Where the database is in WAL mode at ``synchronous`` FULL (the defaults), the
        transaction commits at NORMAL (no fsync: the log's pages are written, the lock
        handed on), then the log is synced outside the lock, before the block returns.
        The commit is as durable when the caller goes on: its log frames are on disk
        (and a checkpoint in between syncs the log before it copies it, and the
        database after). Meanwhile the next writer already works: in a worker, the next
        claim need not wait for the acknowledgement batch's disk write (a 4-thread
        worker drained 1.2x faster, 1.5x with a 1 ms fsync). Other journal modes and
        lower levels commit as :meth:`write_transaction` does.
        """
        with self.store.engine.connect() as conn:
            wal = wal_file(conn)
            with without_flush_wait(conn) if wal else nullcontext(False) as lowered:
                with _written(conn):
                    yield conn
            if wal and lowered:
                sync_file(wal)

    def begin_write(self, conn: Connection) -> None:
        """Take the write lock for *conn*'s transaction (see :mod:`.write_lock`)."""
        begin_write(conn)

    @contextmanager
    def autocommit(self) -> Iterator[Connection]:
        """SQLAlchemy's ``AUTOCOMMIT`` (the store's own writes take the write lock in
        turn instead: nothing of the store's uses this on SQLite)."""
        with self.store.engine.connect() as conn:
            yield conn.execution_options(isolation_level="AUTOCOMMIT")

    def keeping_connections(self) -> AbstractContextManager[None]:
        """Nothing to keep: the claim and the acknowledgements take the write lock in
        a transaction of their own, and a SQLite connection has no plans to lose."""
        return nullcontext()

    # -- statements ---------------------------------------------------------------

    def insert_ignoring(self, table: Table) -> Any:
        return sqlite.insert(table)

    def index_hint(self, index_name: str) -> str:
        """``INDEXED BY`` the index, while hints hold and the table defines it."""
        if not self.hints or not any(ix.name == index_name for ix in self.store.table.indexes):
            return ""
        quote = self.store.engine.dialect.identifier_preparer.quote
        return f" INDEXED BY {quote(index_name)}"

    def past_a_limit(self, error: DBAPIError) -> bool:
        # A string or blob over SQLite's length limit is DataError (SQLITE_TOOBIG): PEP
        # 249's class for a value, already told apart by the class alone.
        return False

    def too_large(self, error: DBAPIError) -> bool:
        return getattr(error.orig, "sqlite_errorcode", None) == sqlite3.SQLITE_TOOBIG

    def lost_index(self, error: OperationalError) -> bool:
        """After "no such index" (a database migrated without it), stop naming indexes."""
        message = str(error.orig)
        if not self.hints or not ("no such index" in message or "no query solution" in message):
            return False
        logger.warning(
            "an index named in a query is missing from the database (%s); falling back "
            "to unhinted queries (create it with `flask defer install` or a migration)",
            message,
        )
        self.hints = False
        self._sql.clear()
        return True

    def ids_in(self, column: Any, ids: Sequence[int]) -> ColumnElement[bool]:
        return column.in_(list(ids))  # type: ignore[no-any-return]

    def key_startswith(self, table: Table, prefix: str) -> ColumnElement[bool]:
        # autoescape escapes % and _ in the bound prefix, so "a_b:" matches only itself;
        # SQLite's LIKE ignores ASCII case, and the exact substr comparison restores it.
        like = table.c.key.startswith(prefix, autoescape=True)
        return like & (func.substr(table.c.key, 1, len(prefix)) == prefix)

    def skip_locked(self, select: Select[Any]) -> Select[Any]:
        return select  # no row locks: one writer at a time

    def lock_in_order(self, conn: Connection, table: Table, ids: Sequence[int]) -> None:
        return None  # the transaction holds the database's one write lock already

    def lock_batch_key(self, conn: Connection, lock_name: str) -> None:
        return None  # one writer at a time: appends already take turns

    def batch_items(self, table: Table, item_json: ColumnElement[str]) -> BatchItems:
        t = table
        iso = func.json_extract(t.c.payload, literal_column("'$.flush_by'"))
        return BatchItems(
            count_before=func.json_array_length(t.c.payload, literal_column("'$.items'")),
            count_after=literal_column("json_array_length(payload, '$.items')"),
            appended=func.json_insert(
                t.c.payload, literal_column("'$.items[#]'"), func.json(item_json)
            ),
            # flush_by is ISO 8601 UTC; SQLite stores times as "YYYY-MM-DD
            # HH:MM:SS.ffffff", which compares correctly as text once the "T" and the
            # offset are cut.
            flush_by=func.substr(iso, 1, 10).op("||")(" ").op("||")(func.substr(iso, 12, 15)),
            earliest=func.min,
        )

    # -- the hot paths ------------------------------------------------------------

    def record_events(self, conn: Connection, events: Sequence[HistoryEvent]) -> None:
        """One event as a plain INSERT on the driver's cursor (:func:`_run`); many as
        one INSERT ... SELECT over a JSON array of their values (one parameter,
        unpacked by SQLite), which cost less than binding each row from Python (an ack
        batch's events, profiled).

        The one event is an Undo's or a cancel's, written while the transaction holds
        SQLite's write lock, so its cost is every other writer's wait: through
        SQLAlchemy's execution it took 31 µs, most of an Undo's hold beyond the raw
        UPDATE's (profiled, ``synchronous=OFF``: 175 against 93 µs).
        """
        history = self.store.history_table
        if history is None or not events:
            return
        if len(events) == 1:
            statement, params = insert_statement(conn, history, events[0].row(), self._tuples)
            begin_write(conn)  # the cursor skips the dialect, which takes the lock in turn
            _run(conn, statement, params)
            return
        stamp = self.stored_time
        values = json.dumps(
            [
                [e.job_id, e.event, stamp(e.at), e.actor, e.attempt, e.error, stamp(e.run_at)]
                for e in events
            ]
        )
        conn.exec_driver_sql(self._events_sql(), (values,))

    def _events_sql(self) -> str:
        """The INSERT of many events from one JSON array of rows ``[job_id, event, at,
        actor, attempt, error, run_at]`` (times as stored), unpacked by SQLite."""
        sql = self._sql.get("events")
        if sql is None:
            table = self._quoted_history()
            columns = ("job_id", "event", "at", "actor", "attempt", "error", "run_at")
            sql = self._sql["events"] = (
                f"INSERT INTO {table} ({', '.join(columns)})"
                f" SELECT {_json_values(len(columns))} FROM json_each(?) ORDER BY key"
            )
        return cast(str, sql)

    def _quoted_history(self) -> str:
        """The history table's name as SQL (schema and quotes included)."""
        history = self.store.history_table
        assert history is not None
        return str(self.store.engine.dialect.identifier_preparer.format_table(history))

    def notify(self, conn: Connection, queue: str) -> None:
        return None  # workers poll

    def lower_waiting(
        self, conn: Connection, children: Sequence[int], closed: int, *, now: datetime, actor: str
    ) -> list[tuple[int, str, datetime]]:
        """One UPDATE ... RETURNING, then the released children's events in one INSERT."""
        t = self.store.table
        last = t.c.waiting_for <= closed
        rows = conn.execute(
            update(t)
            .where(
                self.ids_in(t.c.id, children),
                t.c.status == literal_column("'pending'"),
                t.c.waiting_for.is_not(None),
            )
            .values(
                waiting_for=case((last, None), else_=t.c.waiting_for - closed),
                due_at=case((last & (t.c.run_at < now), now), else_=t.c.due_at),
                updated_at=now,
            )
            .returning(t.c.id, t.c.waiting_for, t.c.queue, t.c.run_at)
        ).all()
        released = [(int(row[0]), str(row[2]), row[3]) for row in rows if row[1] is None]
        # A waiting child never ran: its attempt count is 0.
        self.record_events(
            conn,
            [HistoryEvent(job_id, "released", now, actor, 0, None, run_at)
             for job_id, _, run_at in released],
        )  # fmt: skip
        return released

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
        """The insert on the driver's cursor, then the ``scheduled`` event (none when a
        *keyed* insert found its key taken: None).

        SQLite runs the INSERT in this process in microseconds; SQLAlchemy's execute
        around it cost more (profiled). The cursor, inside the caller's transaction,
        sends the compiled statement with each column's own conversion; *payload_json*
        (the text validation made of the payload) is stored as it is, as the JSON
        column would have encoded it. The cursor bypasses the dialect's execution,
        where the app's writes take the write lock in turn, so the
        transaction is opened that way here; nor do SQL logging and tracing see this
        insert (unlike the claim and the acknowledgements, see :func:`_run`): asking
        whether anyone watches, and a cursor per statement, cost a tenth of a 65 µs
        ``schedule()`` (bench.ab, 10 rounds: 63.1 against 70.7 µs). Its errors are
        SQLAlchemy's, naming the statement that failed.
        """
        sql, order, processors = self.store.job_insert(conn.dialect, keyed=keyed)
        row = insert_values(order, processors, values, payload_json)
        begin_write(conn)
        dbapi = conn.connection.driver_connection
        assert dbapi is not None
        cursor = dbapi.cursor()
        statement, params = sql, tuple(row)
        job_id: int | None = None
        try:
            found = cursor.execute(statement, params).fetchone()
            if found is None:  # keyed, and a live job holds the key
                return None
            job_id = int(found[0])
            if self.store.history_table is not None:
                # Its times are the job's created_at and run_at, converted above.
                at, run_at = row[order.index("created_at")], row[order.index("run_at")]
                statement = self._scheduled_event_sql(conn)
                params = (job_id, at, actor, run_at)
                cursor.execute(statement, params)
        except sqlite3.Error as error:
            if job_id is not None:
                # The event was refused after the row was written: SQLite keeps the
                # caller's transaction open, so a caller that commits anyway would
                # commit a job without its event. Take the row back out (without a
                # savepoint, which every schedule() would pay for).
                with suppress(sqlite3.Error):  # the error raised is the event's
                    cursor.execute(self._unwrite_sql(), (job_id, job_id))
            raise sqlalchemy_error(conn, statement, params, error) from error
        finally:
            cursor.close()
        return job_id

    def _unwrite_sql(self) -> str:
        """The DELETE of the jobs whose ids lie between two bounds: what :meth:`insert_one`
        and :meth:`insert_many` take back out when the database refuses a later write."""
        return f"DELETE FROM {self.store.quoted_table} WHERE id BETWEEN ? AND ?"

    def _scheduled_event_sql(self, conn: Connection) -> str:
        """The INSERT of a new job's ``scheduled`` event, binding its job id, time, actor
        and run_at (in that order), the rest written into the text."""
        sql = self._sql.get("scheduled-event")
        if sql is None:
            history = self.store.history_table
            assert history is not None
            stmt = insert(history).values(
                job_id=bindparam("b_job_id"),
                event=literal_column("'scheduled'"),
                at=bindparam("b_at"),
                actor=bindparam("b_actor"),
                attempt=literal_column("0"),
                run_at=bindparam("b_run_at"),
            )
            compiled = stmt.compile(dialect=conn.dialect)
            assert list(compiled.positiontup or ()) == ["b_job_id", "b_at", "b_actor", "b_run_at"]
            sql = self._sql["scheduled-event"] = compiled.string
        return str(sql)

    def insert_many(
        self, conn: Connection, jobs: Sequence[NewJob], *, now: datetime, actor: str
    ) -> None:
        """One ``INSERT ... SELECT`` over a JSON array of the jobs' values, then the events.

        The rows go to SQLite as one parameter, a JSON array with one array per job,
        which SQLite unpacks in C (``json_each``): binding 24 columns per row from
        Python, and building the dict each came from, was half of a bulk enqueue
        (profiled; 10,000 jobs). The columns are those of the PostgreSQL driver's
        arrays; the rest keep their defaults, as a bulk job sets none of them.
        SQLAlchemy's RETURNING for many rows on SQLite would be one INSERT per row, so
        the ids come from ``last_insert_rowid()``: a table without AUTOINCREMENT gives
        each new row ``max(rowid) + 1``, and this transaction holds the write lock
        from its first row on, so the batch's ids are consecutive and end there. A
        batch whose JSON would be large goes in several statements of at most about
        :data:`BULK_CHUNK_BYTES` (SQLite refuses a parameter over 1 GB), its ids
        consecutive all the same.
        """
        rows = self._bulk_rows(conn, jobs)
        sql = self._sql.get("insert-many")
        if sql is None:
            sql = self._sql["insert-many"] = self._insert_many_sql()
        created = self.stored_time(now)
        span: tuple[int, int] | None = None  # the ids of the rows written so far
        try:
            for chunk in runs_by_size(rows, BULK_CHUNK_BYTES, _payload_bytes):
                conn.exec_driver_sql(sql, (created, created, json.dumps(chunk)))
                last = int(conn.exec_driver_sql("SELECT last_insert_rowid()").scalar_one())
                span = (span[0] if span else last - len(chunk) + 1, last)
            if self.store.history_table is None or span is None:
                return
            # Their scheduled events are made by SQLite from the rows just written (each
            # event's run_at is its row's): one statement, and no Python per event.
            conn.exec_driver_sql(
                f"INSERT INTO {self._quoted_history()} (job_id, event, at, actor, attempt,"
                f" run_at) SELECT id, 'scheduled', ?, ?, 0, run_at FROM"
                f" {self.store.quoted_table} WHERE id BETWEEN ? AND ? ORDER BY id",
                (created, actor, *span),
            )
        except DBAPIError:
            # Refused after some rows were written (a later chunk, or the events): SQLite
            # keeps the caller's transaction open, so a caller that commits anyway would
            # commit part of the batch. Take this call's rows back out, as insert_one
            # does; an error in that leaves the one being raised.
            if span is not None:
                with suppress(DBAPIError):
                    conn.exec_driver_sql(self._unwrite_sql(), span)
            raise

    def _bulk_rows(self, conn: Connection, jobs: Sequence[NewJob]) -> list[list[Any]]:
        """Each job's values for :meth:`_insert_many_sql`, in the order of
        :data:`BULK_COLUMNS` and stored form: the payload's JSON text (made while
        validating, or by the column's type), times as text."""
        encode = self.store.table.c.payload.type.dialect_impl(conn.dialect).bind_processor(
            conn.dialect
        )
        stamp = self.stored_time
        stamped: dict[datetime, Any] = {}  # a batch shares its times: each converted once

        def at(value: datetime | None) -> Any:
            if value is None:
                return None
            text = stamped.get(value)
            if text is None:
                text = stamped[value] = stamp(value)
            return text

        def payload_of(job: NewJob) -> str:
            if job.payload_json is not None:  # encoded while validating: stored as is
                return job.payload_json
            return str(encode(job.payload)) if encode is not None else json.dumps(job.payload)

        return [
            [
                job.name,
                job.queue,
                job.key,
                payload_of(job),
                at(job.run_at),
                job.max_attempts,
                job.owner,
                job.label,
                at(job.undo_until),
                job.priority,
                at(job.expires_at),
            ]
            for job in jobs
        ]

    def _insert_many_sql(self) -> str:
        """The bulk INSERT: each job's values from its array in the JSON parameter."""
        run_at = f"json_extract(value, '$[{BULK_COLUMNS.index('run_at')}]')"
        return (
            f"INSERT INTO {self.store.quoted_table} ({', '.join(BULK_COLUMNS)}, status,"
            " due_at, attempts, created_at, updated_at)"
            f" SELECT {_json_values(len(BULK_COLUMNS))}, 'pending', {run_at}, 0, ?, ?"
            " FROM json_each(?) ORDER BY key"
        )

    def claim(self, params: dict[str, Any], *, queues: bool, actor: str) -> list[Job]:
        """The keyed claim (when keyed jobs are about), then the batch claim, and their
        ``started`` events: one ``BEGIN IMMEDIATE`` transaction, committed without an
        fsync. Keyed jobs go first: a backlog of unkeyed jobs filling every claim
        must not starve the ones a limit holds back.

        The statements run on sqlite3's own connection (see :func:`_run`), the values
        bound as the table stores them. The batch claim's jobs are built from its rows
        after the commit: the transaction holds SQLite's one write lock, which the
        worker's acknowledgements wait for, and building them inside it held the lock
        about a tenth longer (a claim of 20 holds it 1.0-1.5 ms in a drain; the keyed
        claim's jobs are built inside, for its rate-limit counts). A row of either claim
        that cannot be read is failed on its own once the claim has committed
        (:meth:`_fail_unreadable`); it counts toward no rate limit, since it never runs.
        """
        limit = params["limit"]
        stamp = self.stored_time
        bound = {
            "now": stamp(params["now"]),
            "lease_until": stamp(params["lease_until"]),
            "token": params["token"],
            "limit": limit,
        }
        if queues:
            bound["queues"] = json.dumps(list(params["queues"]))
        keyed: list[Job] = []
        unreadable: list[tuple[Sequence[Any], Exception]] = []
        rows: list[Sequence[Any]] = []
        sql, build, id_at = self._claim_statement("due", queues)
        with self.store.engine.connect() as conn, without_flush_wait(conn), _written(conn):
            if self.store.keyed_in_play(conn):
                keyed_sql, build_keyed, _ = self._claim_statement("keyed", queues)
                keyed_rows = _run(conn, keyed_sql, bound).fetchall()
                keyed = _built(keyed_rows, build_keyed, unreadable)
                self.store.record_starts(conn, keyed, params["now"])
                taken = len(keyed_rows)
            else:
                keyed_rows, taken = [], 0
            if taken < limit:
                rows = _run(conn, sql, {**bound, "limit": limit - taken}).fetchall()
            ids = [row[id_at] for row in keyed_rows] + [row[id_at] for row in rows]
            self._record_started(conn, ids, bound["now"], actor)
        jobs = keyed + _built(rows, build, unreadable)
        if unreadable:
            self._fail_unreadable(unreadable, id_at, params, actor)
        return jobs

    def _fail_unreadable(
        self, unreadable: list[tuple[Sequence[Any], Exception]], id_at: int,
        params: dict[str, Any], actor: str,
    ) -> None:
        """Fail the just-claimed jobs whose rows cannot be read (each with its
        reader's error), and log them; in one write, after the claim's commit.

        SQLite keeps JSON and times as text, so text written into the table by hand
        (PostgreSQL's typed columns refuse it) can be unreadable. Raising would leave
        the claim's other jobs running for a lease, their attempts spent, and every
        later claim that takes the row would do the same. Nor does a failed write
        raise: the claim committed, and its readable jobs must start. Those rows stay
        running, and come back when their leases lapse, to be failed then.
        """
        names = [c.name for c in self.store.table.c]
        readers = self._readers()
        acks = []
        for row, error in unreadable:
            unread = [
                name
                for name, value in zip(names, row, strict=True)
                if value is not None and name in readers and not _reads(readers[name], value)
            ]
            where = f" ({', '.join(unread)})" if unread else ""
            note = f"its row could not be read{where}: {error}"
            job_id, attempt = int(row[id_at]), int(row[names.index("attempts")])
            acks.append(Ack(job_id, params["token"], "failed", last_error=note, attempt=attempt))
        try:
            self.acknowledge_many(acks, now=params["now"], actor=actor)
        except SQLAlchemyError as error:
            logger.error(
                "could not fail %d job(s) whose rows cannot be read (%s); they stay "
                "running until their leases lapse", len(acks), getattr(error, "orig", error),
            )  # fmt: skip
            return
        for ack in acks:  # logged once written, like any outcome
            logger.error("job %d failed without running: %s", ack.job_id, ack.last_error)

    def _record_started(self, conn: Connection, ids: list[int], at: Any, actor: str) -> None:
        """The claimed jobs' (*ids*) ``started`` events at *at* (as stored), made by
        SQLite from their rows (each event's attempt is its row's, counted by the
        claim): one statement with one parameter for the ids, and no Python per event
        (building and binding them was an eighth of a drain, profiled)."""
        if self.store.history_table is None or not ids:
            return
        sql = self._sql.get("started")
        if sql is None:
            sql = self._sql["started"] = (
                f"INSERT INTO {self._quoted_history()} (job_id, event, at, actor, attempt)"
                f" SELECT id, 'started', ?, ?, attempts FROM {self.store.quoted_table}"
                " WHERE id IN (SELECT value FROM json_each(?)) ORDER BY id"
            )
        _run(conn, sql, (at, actor, json.dumps(ids)))

    def _claim_statement(
        self, kind: str, queues: bool
    ) -> tuple[str, Callable[[Sequence[Any]], Job], int]:
        """The claim of *kind* (``due`` or ``keyed``): one UPDATE inside the caller's
        ``BEGIN IMMEDIATE``, returning the table's columns; every value a named bind
        (``:now``), the queues one JSON array. Built once per (kind, queues), with the
        builder of its rows and the position of their ``id``.

        It runs on sqlite3's own connection (:func:`_run`) and its rows are built here,
        each column read with the result processor SQLAlchemy's type would use:
        SQLAlchemy's execution and row handling were a fifth of a claim (a claim of 20
        in one process: 721-771 against 604-636 µs this way)."""
        key = ("claim", kind, queues)
        cached = self._sql.get(key)
        if cached is not None:
            return cast("tuple[str, Callable[[Sequence[Any]], Job], int]", cached)
        table = self.store.table
        tables = self.store.claim_tables()
        dialect = self.store.engine.dialect
        quote = dialect.identifier_preparer.quote
        # Named, in the metadata's order: rows are built by position, and a table grown
        # by revisions has its columns in another order than a new one.
        columns = ", ".join(quote(c.name) for c in table.c)
        if kind == "keyed":
            ctes, ids = keyed_ids_sql(tables, queues=queues, member=QUEUES_JSON)
        else:
            ctes, ids = due_ids_sql(tables, queues=queues, lock=False, member=QUEUES_JSON)
        sets = (
            "status = 'running', attempts = attempts + 1, claim_token = :token,"
            " lease_expires_at = :lease_until, updated_at = :now"
        )
        # No second "status = 'pending'" test on the outer UPDATE: the subquery picks
        # pending rows inside the same BEGIN IMMEDIATE transaction, which no other
        # writer can interleave with, and the extra term made SQLite walk every pending
        # row through the status index instead of looking the chosen ids up by rowid.
        prefix = f"WITH RECURSIVE {ctes} " if ctes else ""
        sql = f"{prefix}UPDATE {tables.jobs} SET {sets} WHERE id IN ({ids}) RETURNING {columns}"
        names = [c.name for c in table.c]
        built = self._sql[key] = (
            sql, Job.builder(names, convert=self._readers()), names.index("id")
        )
        return built

    def _readers(self) -> dict[str, Callable[[Any], Any]]:
        """Each column's reader of its stored value (the result processor SQLAlchemy's
        type would use), for the columns that have one; built once."""
        readers = self._sql.get("readers")
        if readers is None:
            dialect = self.store.engine.dialect
            readers = self._sql["readers"] = {
                c.name: read
                for c in self.store.table.c
                if (read := c.type.dialect_impl(dialect).result_processor(dialect, None))
            }
        return cast("dict[str, Callable[[Any], Any]]", readers)

    def acknowledge_many(self, acks: Sequence[Ack], now: datetime, actor: str) -> set[int]:
        """One UPDATE for the whole batch, in one ``BEGIN IMMEDIATE`` transaction: one
        commit (one fsync) for the batch, then the events in one INSERT.

        Each acknowledgement stays a compare-and-set on its own row (its id, its claim
        token, still running): the rows go as one JSON array, which SQLite unpacks in C
        (``json_each``) and joins to the table by primary key (``UPDATE ... FROM``).
        ``RETURNING`` names the rows it owned and whether they have children, which a
        second look-up used to find. Against one UPDATE per row on the driver's cursor
        (60-odd a batch, each releasing and retaking Python's lock beside the handler
        threads), a default worker's drain used 3-5 % less CPU (A/B).
        """
        sql = self._sql.get("ack")
        if sql is None:
            sql = self._sql["ack"] = self._ack_sql()
        stamp = self.stored_time
        at = stamp(now)
        rows = [
            [
                a.job_id, a.claim_token, a.status, stamp(a.run_at), stamp(a.due_at),
                a.attempts_delta, a.last_error, a.result_json(),
            ]  # fmt: skip
            for a in acks
        ]
        # Results have no size bound: a batch of large ones goes in several statements
        # (SQLite refuses a parameter over 1 GB). Not ASCII-escaped: SQLite reads
        # escapes slower, and a lone surrogate is refused by the driver, as a value
        # bound alone was, instead of being stored as text nothing could read back.
        chunks = [
            json.dumps(chunk, ensure_ascii=False)
            for chunk in runs_by_size(rows, BULK_CHUNK_BYTES, _ack_bytes)
        ]
        # Each row's event, made before the transaction (which holds the write lock the
        # claim waits for) and written for the rows the batch owned.
        events = (
            None
            if self.store.history_table is None
            else [
                [a.job_id, a.event, at, actor, a.attempt, a.last_error, stamp(a.run_at)]
                for a in acks
            ]
        )
        with self.durable_write() as conn:
            returned = [
                row for chunk in chunks for row in _run(conn, sql, (at, at, chunk)).fetchall()
            ]
            owned = {int(row[0]) for row in returned}
            # Settled parents: their children are released (or cancelled) in the same
            # transaction (no child can attach in between: one writer at a time).
            parents = [int(row[0]) for row in returned if row[2] and row[1] in SETTLING]
            if events is not None and owned:
                owned_events = json.dumps([e for e in events if e[0] in owned])
                _run(conn, self._events_sql(), (owned_events,))
            if parents:
                self.store.release_children(conn, parents, now=now, actor=actor)
        return owned

    def _ack_sql(self) -> str:
        """The batch acknowledgement: binds the time twice (``finished_at`` of a row it
        settles, every row's ``updated_at``), then the JSON array of the rows, each
        ``[id, claim_token, status, run_at, due_at, attempts_delta, last_error,
        result]`` (``run_at`` and ``due_at`` None to keep the row's).

        ``NOT INDEXED``: without statistics the planner may walk every running row
        through the status index and look each up in the array; with it, the only way
        in left is the one meant, each array row's id looked up as the rowid.
        """
        t = self.store.quoted_table
        a = "flask_defer_ack"  # the rows' alias: a name no table of the app has
        fields = ("id", "token", "status", "run_at", "due_at", "delta", "error", "result")
        values = _json_values(len(fields), fields)
        # RETURNING names the updated table's columns bare: it sees no other table, and
        # SQLite refuses a schema-qualified column there.
        return (
            f"UPDATE {t} NOT INDEXED SET status = {a}.status,"
            f" run_at = COALESCE({a}.run_at, {t}.run_at),"
            f" due_at = COALESCE({a}.due_at, {t}.due_at),"
            f" attempts = {t}.attempts + {a}.delta, last_error = {a}.error,"
            f" result = CASE WHEN {a}.status = 'done' THEN {a}.result ELSE {t}.result END,"
            f" finished_at = CASE WHEN {a}.status IN ('done', 'failed') THEN ?"
            f" ELSE {t}.finished_at END,"
            " claim_token = NULL, lease_expires_at = NULL, updated_at = ?"
            f" FROM (SELECT {values} FROM json_each(?)) AS {a}"
            f" WHERE {t}.id = {a}.id AND {t}.claim_token = {a}.token"
            f" AND {t}.status = 'running'"
            " RETURNING id, status, dependents"
        )

    @contextmanager
    def maintenance_lock(self) -> Iterator[bool]:
        """Always True: writes are serialised anyway and reclaim and prune are guarded."""
        yield True

    def open_listener(self) -> Any:
        raise RuntimeError("LISTEN needs PostgreSQL through psycopg 3")

    def probe_listener(self, token: str) -> None:
        raise RuntimeError("LISTEN needs PostgreSQL through psycopg 3")


#: The columns a bulk insert sets from each job (those of the PostgreSQL driver's
#: arrays), in the order of its values; the rest keep their defaults.
BULK_COLUMNS = (
    "name", "queue", "key", "payload", "run_at", "max_attempts", "owner", "label",
    "undo_until", "priority", "expires_at",
)  # fmt: skip


def _built(
    rows: Sequence[Sequence[Any]],
    build: Callable[[Sequence[Any]], Job],
    unreadable: list[tuple[Sequence[Any], Exception]],
) -> list[Job]:
    """The jobs of *rows*; each row that cannot be read goes to *unreadable* instead,
    with its error, to be failed once the claim has committed."""
    jobs = []
    for row in rows:
        try:
            jobs.append(build(row))
        except (ValueError, TypeError) as error:
            unreadable.append((row, error))
    return jobs


def _reads(read: Callable[[Any], Any], value: Any) -> bool:
    """Whether *read* (a column's reader) reads the stored *value*."""
    try:
        read(value)
    except (ValueError, TypeError):
        return False
    return True


def _json_values(count: int, names: Sequence[str] = ()) -> str:
    """The select list taking *count* values, in order, from each array of a
    ``json_each`` over a JSON array of arrays; named *names* when given."""
    if names:
        assert len(names) == count
        return ", ".join(
            f"json_extract(value, '$[{i}]') AS {name}" for i, name in enumerate(names)
        )
    return ", ".join(f"json_extract(value, '$[{i}]')" for i in range(count))


#: About how much JSON one statement of a bulk insert carries (payloads counted; a
#: job's other values add a hundred bytes or so): far below SQLite's 1 GB limit on a
#: parameter, and large enough that a 10,000-job batch of small payloads is one.
BULK_CHUNK_BYTES = 16_000_000


_PAYLOAD_AT = BULK_COLUMNS.index("payload")


def _payload_bytes(row: list[Any]) -> int:
    """A bulk insert row's large value: its payload (see :data:`BULK_COLUMNS`)."""
    return len(row[_PAYLOAD_AT])


def _ack_bytes(row: list[Any]) -> int:
    """An acknowledgement row's large values, escaped twice at worst: its error text and
    its result (see :meth:`SqliteDriver._ack_sql`)."""
    return 2 * (len(row[6] or "") + len(row[7] or ""))


@contextmanager
def _written(conn: Connection) -> Iterator[None]:
    """*conn*'s write transaction for the block: ``BEGIN IMMEDIATE`` in turn with this
    process's other writers, committed at its end, rolled back on any error."""
    begin_write(conn)
    try:
        yield
    except BaseException:
        conn.rollback()
        raise
    conn.commit()


def _run(conn: Connection, sql: str, params: Any) -> Any:
    """Run *sql* on *conn*'s sqlite3 connection in its transaction, past SQLAlchemy's
    execution, and return the cursor (``rowcount``, ``fetchone``, ``fetchall``).

    Its error is SQLAlchemy's (the store recognises a lost index by its
    ``OperationalError``; the worker's loop and the acknowledgement flusher retry on
    ``SQLAlchemyError``). While anyone watches the engine's statements
    (:mod:`..watching`) it runs through
    SQLAlchemy instead, so they see it.
    """
    if watched(conn):
        return _Rows(conn.exec_driver_sql(sql, params))
    dbapi: Any = conn.connection.driver_connection
    try:
        return dbapi.execute(sql, params)
    except sqlite3.Error as error:
        raise sqlalchemy_error(conn, sql, params, error) from error


class _Rows:
    """SQLAlchemy's result answering as a sqlite3 cursor (a statement without rows
    fetches none)."""

    def __init__(self, result: Any) -> None:
        self._result = result
        self.rowcount: int = result.rowcount

    def fetchone(self) -> Any:
        return self._result.fetchone() if self._result.returns_rows else None

    def fetchall(self) -> list[Any]:
        return list(self._result) if self._result.returns_rows else []
