"""The PostgreSQL driver: row locks that skip, one round trip per hot statement.

PostgreSQL runs statements in another process, so a round trip is the unit of cost,
and rows lock one by one, so many writers work side by side. Hence:

* the claim is one autocommit statement whose CTEs lock the due ids (``FOR UPDATE
  SKIP LOCKED``), start them, write their ``started`` events and turn off the commit's
  wait for the disk; keyed claims are serialised per table by a transaction-scoped
  advisory lock, so two workers never both fill a key's last slot;
* the keyless insert carries its ``scheduled`` event and its ``NOTIFY`` in CTEs of
  the same statement; bulk inserts and batched acknowledgements bind each column as
  one array (``unnest``), in psycopg's binary format for the bulk insert;
* statements run through the driver (``exec_driver_sql``) where SQLAlchemy's result
  processing cost more than the round trip, and the claim and the one-job insert on
  psycopg's own cursor (profiled);
* workers ``LISTEN`` for new jobs on a dedicated connection (psycopg 3 only).

Over 400 lines because it is one database's whole side of the store: its hot
statements are written as text next to each other so each can be read against the
others (the same CTE shapes, the same array binds), and splitting them by length
would only separate a statement from the reason it is shaped that way.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta
from operator import attrgetter
from typing import Any, ClassVar, cast

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Engine,
    Select,
    Table,
    any_,
    bindparam,
    event,
    func,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import DBAPIError, OperationalError

from ...errors import NotConfigured
from ...jobs import Job, JobStatus
from ..chunking import runs_by_size
from ..claim_sql import KEYED, QUEUES_ARRAY, due_ids_sql, keyed_ids_sql
from ..parts import StoreParts, insert_values
from ..records import (
    NOTIFY_CHANNEL,
    PROBE_CHANNEL,
    SETTLING,
    Ack,
    BatchItems,
    HistoryEvent,
    NewJob,
)
from ..utc_datetime import UTCDateTime
from ..watching import sqlalchemy_error, watched
from .kept import KeptConnections

#: What a lost prepared statement means, and what to do (see ``prepare_engine``).
POOLER_PREPARED_STATEMENTS = (
    "PostgreSQL lost a prepared statement between two transactions: the database URL "
    "goes through a transaction-mode pooler (PgBouncer before 1.21, Supavisor, Neon's "
    "pooled URL ...), which gives each transaction another server connection. Turn "
    "psycopg's prepared statements off for this engine: "
    "SQLALCHEMY_ENGINE_OPTIONS = {'connect_args': {'prepare_threshold': None}} (or run "
    "PgBouncer 1.21+ with max_prepared_statements), and give the worker's LISTEN a "
    "direct connection with DEFER_LISTEN_DATABASE_URI"
)


#: Past this many events in one call, they go in one statement over arrays.
MANY_EVENTS = 50

class PostgresDriver:
    """The store's PostgreSQL side (see the module's docstring and :mod:`..driver`)."""

    name: ClassVar[str] = "postgresql"
    serialises_writes: ClassVar[bool] = False
    notifies: ClassVar[bool] = True
    events_in_statement: ClassVar[bool] = True
    null_time = "CAST(NULL AS TIMESTAMP WITH TIME ZONE)"

    def __init__(self, store: StoreParts) -> None:
        self.store = store
        # Prebuilt statements, by name.
        self._sql: dict[Any, Any] = {}
        self._history_insert: Any = (
            insert(store.history_table) if store.history_table is not None else None
        )
        # The worker's loop and flusher keep their autocommit connection (see .kept).
        self._kept = KeptConnections(self._autocommit_checkout, _autocommit_release)

    @property
    def can_listen(self) -> bool:
        """LISTEN needs psycopg 3 (its ``notifies()`` generator)."""
        return self.store.engine.dialect.driver == "psycopg"

    @property
    def listen_unavailable(self) -> str | None:
        if self.can_listen:
            return None
        return "LISTEN/NOTIFY needs the psycopg 3 driver (postgresql+psycopg://)"

    @staticmethod
    def prepare_engine(
        engine: Engine, busy_timeout: timedelta, synchronous: str | None = None
    ) -> None:
        """Nothing to tune (rows lock themselves); one error is made to say what to do.

        psycopg prepares a statement on the server from its sixth run on a connection.
        Behind a transaction-mode pooler the next transaction may land on another
        server connection, where that statement does not exist: PostgreSQL's bare
        ``prepared statement "_pg3_0" does not exist`` becomes :class:`NotConfigured`
        naming the pooler and the engine option that avoids it.
        """

        def explain(context: Any) -> None:
            _explain_pooler(context.original_exception)

        event.listen(engine, "handle_error", explain)

    # -- transactions -------------------------------------------------------------

    @contextmanager
    def write_transaction(self) -> Iterator[Connection]:
        with self.store.engine.begin() as conn:
            yield conn

    def begin_write(self, conn: Connection) -> None:
        return None  # rows lock themselves; the transaction begins with the statement

    @contextmanager
    def autocommit(self) -> Iterator[Connection]:
        """A connection in autocommit, switched on the driver's connection itself and
        back before the pool has it again: what SQLAlchemy's ``isolation_level=
        "AUTOCOMMIT"`` does, without its bookkeeping of the connection's
        characteristics, which cost 40-65 µs of CPU a checkout against 20 µs this way
        (psycopg, measured), paid by every claim and every batch of outcomes.

        A driver connection without the attribute, or already in autocommit (an
        engine made with ``isolation_level="AUTOCOMMIT"``), goes SQLAlchemy's way, and
        so does a watched engine (:mod:`..watching`): its SQL log then says the
        statements commit on their own, not "BEGIN (implicit)" and "ROLLBACK" around
        them. One that cannot be switched back (the server went away) is invalidated,
        so the pool never hands it out in autocommit.

        Inside :meth:`keeping_connections` (a worker's loop, its flusher) the thread
        keeps that connection from one block to the next while it is busy.
        """
        with self._kept.use() as kept:
            if kept is not None:
                yield kept
                return
        conn, switched = self._autocommit_open()
        try:
            yield conn
        finally:
            if switched:
                _autocommit_release(conn)
            else:
                conn.close()

    def keeping_connections(self) -> AbstractContextManager[None]:
        """Let the calling thread keep its autocommit connection between statements
        for the block (see :mod:`.kept`: fewer plans on the server)."""
        return self._kept.keeping()

    def _autocommit_open(self) -> tuple[Connection, bool]:
        """A pooled connection in autocommit, and True when that was switched on
        psycopg's connection (to be switched back by :func:`_autocommit_release`);
        False when it went SQLAlchemy's way (see :meth:`autocommit`)."""
        conn = self.store.engine.connect()
        dbapi: Any = conn.connection.driver_connection
        if getattr(dbapi, "autocommit", None) is not False or watched(conn):
            return conn.execution_options(isolation_level="AUTOCOMMIT"), False
        dbapi.autocommit = True
        return conn, True

    def _autocommit_checkout(self) -> Connection | None:
        """A connection for a thread to keep: one switched on psycopg's side, or None
        (a watched engine's statements go SQLAlchemy's way, never kept)."""
        conn, switched = self._autocommit_open()
        if not switched:
            conn.close()
            return None
        return conn

    # -- statements ---------------------------------------------------------------

    def insert_ignoring(self, table: Table) -> Any:
        return postgresql.insert(table)

    def index_hint(self, index_name: str) -> str:
        return ""  # the planner has statistics

    def lost_index(self, error: OperationalError) -> bool:
        return False

    def past_a_limit(self, error: DBAPIError) -> bool:
        # SQLSTATE class 54, "program limit exceeded": a jsonb value over 256 MB, an
        # array parameter over 1 GB, too many columns or arguments. psycopg raises it
        # as OperationalError, the class of a database that is down or busy.
        return str(getattr(error.orig, "sqlstate", None) or "").startswith("54")

    def too_large(self, error: DBAPIError) -> bool:
        # Class 54 is where PostgreSQL reports a value past its size limits (jsonb's
        # 256 MB, a field's 1 GB); its other limits are a statement's, not a value's,
        # and none of those a single job's outcome reaches.
        return self.past_a_limit(error)

    def key_startswith(self, table: Table, prefix: str) -> ColumnElement[bool]:
        # autoescape escapes % and _ in the bound prefix, so "a_b:" matches only itself.
        return table.c.key.startswith(prefix, autoescape=True)

    def skip_locked(self, select: Select[Any]) -> Select[Any]:
        return select.with_for_update(skip_locked=True)

    def ids_in(self, column: Any, ids: Sequence[int]) -> ColumnElement[bool]:
        # One array parameter, not one per id: a thousand-id IN list cost the release
        # of a parent's children more in parameters than in rows.
        return column == any_(bindparam(None, list(ids), type_=postgresql.ARRAY(BigInteger)))  # type: ignore[no-any-return]

    def lock_in_order(self, conn: Connection, table: Table, ids: Sequence[int]) -> None:
        # NO KEY UPDATE: what the UPDATEs that follow take anyway, so a child being
        # attached (FOR KEY SHARE on its parents) is not held up by it.
        conn.execute(
            select(table.c.id)
            .where(self.ids_in(table.c.id, ids))
            .order_by(table.c.id)
            .with_for_update(key_share=True)
        )

    def lock_batch_key(self, conn: Connection, lock_name: str) -> None:
        """A transaction-level advisory lock on *lock_name* (a hash collision only makes
        two keys take turns), released at commit or rollback."""
        conn.execute(
            select(func.pg_advisory_xact_lock(func.hashtextextended(bindparam("k"), 0))),
            {"k": lock_name},
        )

    def batch_items(self, table: Table, item_json: ColumnElement[str]) -> BatchItems:
        t = table
        items = t.c.payload.op("->")(literal_column("'items'"))
        return BatchItems(
            count_before=func.jsonb_array_length(items),
            count_after=literal_column("jsonb_array_length(payload -> 'items')"),
            # A one-element array concatenated to the list appends the item, even when
            # the item is itself an array.
            appended=func.jsonb_set(
                t.c.payload,
                literal_column("'{items}'"),
                items.op("||")(func.jsonb_build_array(sql_cast(item_json, postgresql.JSONB))),
            ),
            flush_by=sql_cast(
                t.c.payload.op("->>")(literal_column("'flush_by'")),
                postgresql.TIMESTAMP(timezone=True),
            ),
            earliest=func.least,
        )

    def _quoted(self, table: Table) -> str:
        return self.store.engine.dialect.identifier_preparer.format_table(table)

    # -- the hot paths ------------------------------------------------------------

    def record_events(self, conn: Connection, events: Sequence[HistoryEvent]) -> None:
        if self._history_insert is None or not events:
            return
        if len(events) > MANY_EVENTS:
            # A thousand released or cancelled children: one statement over arrays.
            self._record_many_events(conn, events)
            return
        rows = [event.row() for event in events]
        # One row, or batched multi-row VALUES (SQLAlchemy's insertmanyvalues).
        conn.execute(self._history_insert, rows[0] if len(rows) == 1 else rows)

    def _record_many_events(self, conn: Connection, events: Sequence[HistoryEvent]) -> None:
        assert self.store.history_table is not None
        history = self._quoted(self.store.history_table)
        # The arrays in psycopg's binary format (%b), as the bulk insert sends them: as
        # text each element was matched against quoting patterns in Python, a third of
        # the release of 1,000 children (profiled).
        conn.exec_driver_sql(
            f"INSERT INTO {history} (job_id, event, at, actor, attempt, error, run_at)"
            " SELECT * FROM unnest(%(ids)b::bigint[], %(events)b::text[],"
            " %(ats)b::timestamptz[], %(actors)b::text[], %(attempts)b::int[],"
            " %(errors)b::text[], %(run_ats)b::timestamptz[])",
            _arrays(
                events, ids="job_id", events="event", ats="at", actors="actor",
                attempts="attempt", errors="error", run_ats="run_at",
            ),
        )  # fmt: skip

    def lower_waiting(
        self, conn: Connection, children: Sequence[int], closed: int, *, now: datetime, actor: str
    ) -> list[tuple[int, str, datetime]]:
        """One statement: the UPDATE, and the released children's events inserted from
        its RETURNING in a CTE. As two statements, the 1,000 events' arrays were built
        in Python and sent back to the server that had just returned their values."""
        sql = self._sql.get("lower-waiting")
        if sql is None:
            sql = self._sql["lower-waiting"] = self._lower_waiting_sql()
        rows = conn.exec_driver_sql(
            sql, {"ids": list(children), "n": closed, "now": now, "actor": actor}
        ).all()
        return [(int(row[0]), str(row[1]), row[2]) for row in rows]

    def _lower_waiting_sql(self) -> str:
        t = self.store.quoted_table
        lowered = (
            f"lowered AS (UPDATE {t} SET"
            " waiting_for = CASE WHEN waiting_for <= %(n)s::int THEN NULL"
            " ELSE waiting_for - %(n)s::int END,"
            " due_at = CASE WHEN waiting_for <= %(n)s::int AND run_at < %(now)s::timestamptz"
            " THEN %(now)s::timestamptz ELSE due_at END,"
            " updated_at = %(now)s::timestamptz"
            " WHERE id = ANY(%(ids)b::bigint[]) AND status = 'pending'"
            " AND waiting_for IS NOT NULL"
            " RETURNING id, waiting_for, queue, run_at)"
        )
        recorded = ""
        if self.store.history_table is not None:
            # A waiting child never ran: its attempt count is 0.
            recorded = (
                f", recorded AS (INSERT INTO {self._quoted(self.store.history_table)}"
                " (job_id, event, at, actor, attempt, run_at)"
                " SELECT id, 'released', %(now)s::timestamptz, %(actor)s::text, 0, run_at"
                " FROM lowered WHERE waiting_for IS NULL ORDER BY id)"
            )
        return (
            f"WITH {lowered}{recorded}"
            " SELECT id, queue, run_at FROM lowered WHERE waiting_for IS NULL ORDER BY id"
        )

    def notify(self, conn: Connection, queue: str) -> None:
        conn.execute(select(func.pg_notify(NOTIFY_CHANNEL, queue)))

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
        """One prebuilt statement, values as parameters, on psycopg's cursor: the
        ``scheduled`` event and the ``NOTIFY`` ride in its CTEs, so a job costs one
        round trip, not two or three. A *keyed* insert whose key is taken inserts no
        row, so its CTEs write and notify nothing: None.

        Run as the claim is (:func:`_fetch_all`: SQLAlchemy's errors, a lost connection
        invalidated, through SQLAlchemy while anyone watches the engine), and with
        *payload_json* (the text validation made of the payload) sent as it is for the
        server's ``::JSONB`` cast instead of being encoded again. Against
        ``exec_driver_sql``, profiled, the CPU of a ``schedule()`` in an open
        transaction went from 111 to 92 µs; bench.ab against the parent commit, 8
        rounds: one-by-one enqueue 1.196, one ``schedule()`` 0.819.

        The cursor does not begin SQLAlchemy's transaction as ``execute`` would, so
        a *conn* outside one begins it first (else its commit would commit nothing).
        """
        if conn.get_transaction() is None:
            conn.begin()
        history = self.store.history_table is not None
        sql, order, processors = self._prebuilt_insert(
            conn, notify=notify, history=history, keyed=keyed
        )
        params = tuple(insert_values(order, processors, values, payload_json))
        if history:
            params += (values["created_at"], actor, values["run_at"])
        if notify:
            params += (values["queue"],)
        rows = _fetch_all(conn, sql, params)
        return int(rows[0][0]) if rows else None

    def _prebuilt_insert(
        self, conn: Connection, *, notify: bool, history: bool, keyed: bool = False
    ) -> tuple[str, list[str], list[tuple[int, Any]]]:
        key = ("insert", notify, history, keyed)
        cached = self._sql.get(key)
        if cached is not None:
            return cached  # type: ignore[no-any-return]
        sql, order, processors = self.store.job_insert(conn.dialect, keyed=keyed)
        if notify or history:
            ctes = [f"inserted AS ({sql})"]
            if history:
                assert self.store.history_table is not None
                ctes.append(
                    f"recorded AS (INSERT INTO {self._quoted(self.store.history_table)}"
                    " (job_id, event, at, actor, attempt, run_at) SELECT inserted.id,"
                    " 'scheduled', %s, %s, 0, %s FROM inserted)"
                )
            notified = f", pg_notify('{NOTIFY_CHANNEL}', %s)" if notify else ""
            sql = f"WITH {', '.join(ctes)} SELECT inserted.id{notified} FROM inserted"
        built = self._sql[key] = (sql, order, processors)
        return built

    def insert_many(
        self, conn: Connection, jobs: Sequence[NewJob], *, now: datetime, actor: str
    ) -> None:
        """``INSERT ... SELECT FROM unnest(...)``, each column one array, the
        ``scheduled`` events inserted from its RETURNING in the same statement.

        SQLAlchemy's many-row insert built a fresh 1,000-row VALUES text per batch,
        which psycopg then parsed for its 14,000 placeholders: 85% of a bulk enqueue,
        profiled; this is one round trip with seventeen parameters whatever the number
        of jobs. The arrays go in psycopg's binary format (``%b``): as text, each
        element was matched against quoting patterns in Python (measured: 10,000 jobs,
        36-44k against 47-60k jobs/s).
        """
        sql = self._sql.get("insert-many")
        if sql is None:
            sql = self._sql["insert-many"] = self._insert_many_sql()
        params: dict[str, Any] = {
            "now": now,
            "actor": actor,
            # JSON text cast to jsonb by the server: the same jsonb as the column's own
            # conversion writes (a test compares them).
            "payloads": [_payload_json(job) for job in jobs],
            **_arrays(
                jobs, names="name", queues="queue", keys="key", run_ats="run_at",
                max_attempts="max_attempts", owners="owner", labels="label",
                undo_untils="undo_until", priorities="priority", expires_ats="expires_at",
            ),
        }  # fmt: skip
        conn.exec_driver_sql(sql, params)

    def _insert_many_sql(self) -> str:
        t = self.store.quoted_table
        inserted = (
            f"INSERT INTO {t} (name, queue, key, payload, status, run_at, due_at, attempts,"
            " max_attempts, owner, label, undo_until, priority, expires_at, created_at,"
            " updated_at)"
            " SELECT v.name, v.queue, v.key, v.payload::jsonb, 'pending', v.run_at, v.run_at,"
            " 0, v.max_attempts, v.owner, v.label, v.undo_until, v.priority, v.expires_at,"
            " %(now)s, %(now)s"
            " FROM unnest(%(names)b::text[], %(queues)b::text[], %(keys)b::text[],"
            " %(payloads)b::text[], %(run_ats)b::timestamptz[], %(max_attempts)b::int[],"
            " %(owners)b::text[], %(labels)b::text[], %(undo_untils)b::timestamptz[],"
            " %(priorities)b::int[], %(expires_ats)b::timestamptz[])"
            " AS v(name, queue, key, payload, run_at, max_attempts, owner, label, undo_until,"
            " priority, expires_at)"
        )
        if self.store.history_table is None:
            return inserted
        history = self._quoted(self.store.history_table)
        return (
            f"WITH inserted AS ({inserted} RETURNING id, run_at)"
            f" INSERT INTO {history} (job_id, event, at, actor, attempt, run_at)"
            " SELECT id, 'scheduled', %(now)s, %(actor)s, 0, run_at FROM inserted"
        )

    def claim(self, params: dict[str, Any], *, queues: bool, actor: str) -> list[Job]:
        """The keyed claim (when keyed jobs are about) in a transaction holding the
        table's keyed-claim advisory lock, then the batch claim: one autocommit
        statement. Keyed jobs go first: a backlog of unkeyed jobs filling every claim
        must not starve the ones a limit holds back."""
        limit = params["limit"]
        if self.store.history_table is not None:
            params = {**params, "actor": actor}
        jobs: list[Job] = []
        keyed = self.store.keyed_remembered()
        if keyed is None:
            with self.store.autocommit() as conn:
                keyed = self.store.keyed_in_play(conn)
        if keyed:
            with self.store.engine.begin() as conn:
                conn.execute(self._keyed_lock_statement())
                jobs = self._run_claim(conn, "keyed", queues, params)
                # Under the same lock: the next keyed claim counts these starts.
                self.store.record_starts(conn, jobs, params["now"])
        if len(jobs) < limit:
            rest = {**params, "limit": limit - len(jobs)}
            with self.store.autocommit() as conn:
                jobs += self._run_claim(conn, "due", queues, rest)
        return jobs

    def _run_claim(
        self, conn: Connection, kind: str, queues: bool, params: dict[str, Any]
    ) -> list[Job]:
        sql, build = self._claim_statement(kind, queues, params["limit"])
        return [build(row) for row in _fetch_all(conn, sql, params)]

    def _claim_statement(
        self, kind: str, queues: bool, limit: int
    ) -> tuple[str, Callable[[Sequence[Any]], Job]]:
        """The claim's text for the driver and the builder of its rows, built once per
        (kind, queues, limit).

        The limit is written into the text: PostgreSQL plans a prepared statement once
        only when its plan for the given values is no cheaper, and an unknown ``LIMIT``
        looked like a tenth of the table to it, so it planned every claim anew (see
        ``claim_sql.limit_sql``). Run on psycopg's cursor (see :func:`_fetch_all`):
        SQLAlchemy neither binds nor types the values (its result processing of a
        claim's columns cost more than the claim's own round trip under load). psycopg
        returns aware datetimes and parsed JSON; the builder turns the datetimes to
        UTC, as the column type would.
        """
        # Long because: the claim's one statement, built in reading order; its parts are
        # explained where they are written.
        key = ("claim", kind, queues, limit)
        cached = self._sql.get(key)
        if cached is not None:
            return cast("tuple[str, Callable[[Sequence[Any]], Job]]", cached)
        table = self.store.table
        tables = self.store.claim_tables()
        quote = self.store.engine.dialect.identifier_preparer.quote
        # Named, in the metadata's order: rows are built by position, and a table grown
        # by revisions has its columns in another order than a new one.
        columns = ", ".join(quote(c.name) for c in table.c)
        sets = (
            "status = 'running', attempts = attempts + 1, claim_token = %(token)s,"
            " lease_expires_at = %(lease_until)s, updated_at = %(now)s"
        )
        if kind == "keyed":
            ctes, ids = keyed_ids_sql(tables, queues=queues, limit=limit, member=QUEUES_ARRAY)
            ids = (
                f"SELECT id FROM {tables.jobs} WHERE id IN ({ids}) AND {KEYED}"
                " FOR UPDATE SKIP LOCKED"
            )
        else:
            ctes, ids = due_ids_sql(
                tables, queues=queues, lock=True, limit=limit, member=QUEUES_ARRAY
            )
        # A materialised CTE runs the locking SELECT exactly once. As an IN (...) subquery
        # PostgreSQL may re-run it per row, claiming more than the limit.
        parts = [ctes] if ctes else []
        parts.append(f"due AS MATERIALIZED ({ids})")
        # = ANY(ARRAY(...)): the ids looked up by primary key whatever the plan guesses of
        # their number (a join planned for an unknown count hashed a scan of the table).
        parts.append(
            f"claimed AS (UPDATE {tables.jobs} SET {sets} WHERE id = ANY(ARRAY(SELECT id FROM"
            f" due)) RETURNING {columns})"
        )
        if self.store.history_table is not None:
            parts.append(
                f"recorded AS (INSERT INTO {self._quoted(self.store.history_table)} (job_id,"
                " event, at, actor, attempt) SELECT id, 'started', %(now)s, %(actor)s,"
                " attempts FROM claimed)"
            )
        # set_config(..., true): this transaction's commit does not wait for the WAL
        # flush (measured: the flush was 0.4-1 ms of every claim with fsync on).
        sql = (
            f"WITH RECURSIVE {', '.join(parts)} SELECT {columns},"
            " set_config('synchronous_commit', 'off', true) AS _no_flush_wait FROM claimed"
        )
        # The shared texts bind ":name"; the driver's placeholders are "%(name)s".
        sql = _pyformat(sql.replace("%", "%%").replace("%%(", "%("))
        names = [c.name for c in table.c]
        stamps = [c.name for c in table.c if isinstance(c.type, UTCDateTime)]
        built = self._sql[key] = (sql, Job.builder(names, to_utc=stamps))
        return built

    def _keyed_lock_statement(self) -> Any:
        """The advisory lock that serialises keyed claims of this table."""
        lock = zlib.crc32(f"flask_defer:keyed:{self.store.table.name}".encode())
        return select(func.pg_advisory_xact_lock(lock))

    def acknowledge_many(self, acks: Sequence[Ack], now: datetime, actor: str) -> set[int]:
        """One statement over the whole batch (``UPDATE ... FROM unnest(...) ...
        RETURNING id``) on an autocommit connection: one round trip and one commit for
        any number of jobs, its history events in a CTE of the same statement. A batch
        whose results and errors together pass :data:`ACK_CHUNK_BYTES` goes in several
        such statements, in one transaction.

        The batch never waits for a row lock: rows another transaction holds (an app's
        UPDATE that re-checked our row under READ COMMITTED keeps a lock on it until it
        ends) are skipped and answered "busy". Waiting there while holding the batch's
        other rows could close a deadlock with that transaction; instead each busy row
        is written alone afterwards, holding nothing else.
        """
        history = self.store.history_table is not None
        sql = self._sql.get(("ack", history))
        if sql is None:
            sql = self._sql[("ack", history)] = self._ack_many_sql(history)
        rows = [(a, a.result_json()) for a in acks]
        # Results have no size bound, and one array parameter no more than 1 GB: a
        # batch of large ones goes in several statements of one transaction.
        runs = list(runs_by_size(rows, ACK_CHUNK_BYTES, _ack_bytes))
        with self.store.autocommit() if len(runs) == 1 else self.store.begin() as conn:
            answer = [
                (int(row[0]), row[1], row[2])
                for run in runs
                for row in conn.exec_driver_sql(sql, _ack_params(run, now, actor, history))
            ]
        owned = {job_id for job_id, written, _ in answer if written}
        busy = {job_id for job_id, written, _ in answer if not written}
        settling = {a.job_id for a in acks if a.status in SETTLING}
        parents = [job_id for job_id, written, has_children in answer
                   if written and has_children and job_id in settling]  # fmt: skip
        for ack in acks:
            if ack.job_id in busy and self._acknowledge_one(ack, now, actor):
                owned.add(ack.job_id)
        if parents:
            # A transaction of its own, right after the batch's statement: should this
            # process die in between, the maintenance round releases them instead.
            with self.store.begin() as conn:
                self.store.release_children(conn, parents, now=now, actor=actor)
        return owned

    def _acknowledge_one(self, ack: Ack, now: datetime, actor: str) -> bool:
        """One acknowledgement on its own (it may wait for the row; it holds no other)."""
        t = self.store.table
        values: dict[str, Any] = {
            "status": ack.status,
            "attempts": t.c.attempts + ack.attempts_delta,
            "last_error": ack.last_error,
            "claim_token": None,
            "lease_expires_at": None,
            "updated_at": now,
        }
        if ack.run_at is not None:
            values["run_at"] = ack.run_at
        if ack.due_at is not None:
            values["due_at"] = ack.due_at
        if ack.status == JobStatus.DONE.value:
            values["result"] = ack.result
        if ack.status in (JobStatus.DONE.value, JobStatus.FAILED.value):
            values["finished_at"] = now
        stmt = (
            update(t)
            .where(
                t.c.id == ack.job_id,
                t.c.claim_token == ack.claim_token,
                t.c.status == JobStatus.RUNNING.value,
            )
            .values(values)
        )
        with self.store.begin() as conn:
            row = conn.execute(stmt.returning(t.c.dependents)).first()
            if row is None:
                return False
            event = HistoryEvent(
                ack.job_id, ack.event, now, actor, ack.attempt, ack.last_error, ack.run_at
            )
            self.record_events(conn, [event])
            if row[0] and ack.status in SETTLING:
                self.store.release_children(conn, [ack.job_id], now=now, actor=actor)
            return True

    def _ack_many_sql(self, history: bool) -> str:
        """The batched acknowledgement; with *history*, its events' INSERT rides along."""
        t = self.store.quoted_table
        extra_arrays = ", %(events)b::text[], %(attempts)b::int[]" if history else ""
        extra_names = ", event, attempt" if history else ""
        returning = ", v.event, v.attempt, v.last_error, v.run_at" if history else ""
        recorded = ""
        if history:
            assert self.store.history_table is not None
            recorded = (
                f", recorded AS (INSERT INTO {self._quoted(self.store.history_table)} (job_id,"
                " event, at, actor, attempt, error, run_at) SELECT id, event, %(now)s,"
                " %(actor)s, attempt, last_error, run_at FROM written)"
            )
        return (
            # The arrays in psycopg's binary format (%b): as text, each element was
            # matched against quoting patterns in Python (6% of a drain, profiled).
            "WITH v AS (SELECT * FROM unnest(%(ids)b::bigint[], %(tokens)b::text[],"
            " %(statuses)b::text[], %(run_ats)b::timestamptz[], %(due_ats)b::timestamptz[],"
            f" %(deltas)b::int[], %(errors)b::text[], %(results)b::text[]{extra_arrays})"
            " AS v(id, token, status, run_at, due_at, attempts_delta, last_error, result"
            f"{extra_names})),"
            f" mine AS MATERIALIZED (SELECT t.id FROM {t} AS t JOIN v ON t.id = v.id"
            " AND t.claim_token = v.token WHERE t.status = 'running'"
            " FOR UPDATE OF t SKIP LOCKED),"
            f" written AS (UPDATE {t} AS t SET"
            " status = v.status,"
            " run_at = COALESCE(v.run_at, t.run_at),"
            " due_at = COALESCE(v.due_at, t.due_at),"
            " attempts = t.attempts + v.attempts_delta,"
            " last_error = v.last_error,"
            " result = CASE WHEN v.status = 'done' THEN v.result::jsonb ELSE t.result END,"
            " finished_at = CASE WHEN v.status IN ('done', 'failed') THEN %(now)s"
            " ELSE t.finished_at END,"
            " claim_token = NULL, lease_expires_at = NULL, updated_at = %(now)s"
            " FROM v, mine WHERE t.id = v.id AND t.id = mine.id"
            f" RETURNING t.id, t.dependents{returning})"
            f"{recorded}"
            " SELECT id, true, dependents FROM written"
            f" UNION ALL SELECT t.id, false, false FROM {t} AS t JOIN v ON t.id = v.id"
            " AND t.claim_token = v.token WHERE t.status = 'running'"
            " AND t.id NOT IN (SELECT id FROM mine)"
        )

    @contextmanager
    def maintenance_lock(self) -> Iterator[bool]:
        """A transaction-scoped advisory lock, tried without waiting, held on a
        connection of its own for the block and released by its commit, or by the
        server if this worker dies. One lock per jobs table, so two apps sharing a
        database do not exclude each other (crc32 fits the bigint key, stable)."""
        key = zlib.crc32(f"flask_defer:{self.store.table.name}".encode())
        with self.store.engine.connect() as conn, conn.begin():
            locked = conn.execute(select(func.pg_try_advisory_xact_lock(key))).scalar()
            yield bool(locked)

    def open_listener(self) -> Any:
        """A dedicated psycopg connection, in autocommit, LISTENing on the channel.

        Taken from the engine (so it has the app's credentials and connect options),
        or from ``DEFER_LISTEN_DATABASE_URI``'s direct connection behind a pooler, and
        detached from its pool: it lives as long as the worker and is closed by the
        caller. It also listens on the self-test channel (:meth:`probe_listener`).
        """
        if not self.can_listen:
            raise RuntimeError("LISTEN needs PostgreSQL through psycopg 3")
        engine = self.store.listen_engine or self.store.engine
        pooled = engine.raw_connection()
        conn: Any = pooled.driver_connection
        pooled.detach()
        try:
            conn.rollback()
            conn.autocommit = True
            conn.execute(f'LISTEN "{NOTIFY_CHANNEL}"')
            conn.execute(f'LISTEN "{PROBE_CHANNEL}"')
        except BaseException:
            conn.close()
            raise
        return conn

    def probe_listener(self, token: str) -> None:
        """NOTIFY the self-test channel with *token* through the app's own engine: what
        the app's NOTIFYs take too, so a listener behind a transaction-mode pooler
        (which cannot carry LISTEN) does not hear it, and the worker knows."""
        with self.store.autocommit() as conn:
            conn.execute(select(func.pg_notify(PROBE_CHANNEL, token)))


def _pyformat(sql: str) -> str:
    """*sql* with its ``:name`` binds written as psycopg's ``%(name)s``."""
    return re.sub(r"(?<![:\w]):(\w+)", r"%(\1)s", sql)


def _autocommit_release(conn: Connection) -> None:
    """Switch a kept connection back out of autocommit and return it to the pool; one
    that cannot be switched (the server went away) is invalidated first."""
    try:
        if not conn.invalidated:
            try:
                conn.connection.driver_connection.autocommit = False  # type: ignore[union-attr]
            except conn.dialect.loaded_dbapi.Error:
                conn.invalidate()
    finally:
        conn.close()


def _arrays(items: Sequence[Any], **attributes: str) -> dict[str, list[Any]]:
    """One array parameter per name: the named attribute of every item, in order (the
    columns of an ``unnest(...)``)."""
    return {name: list(map(attrgetter(attr), items)) for name, attr in attributes.items()}


def _payload_json(job: NewJob) -> str:
    """*job*'s payload as the JSON text it is stored as (encoded once, if not yet)."""
    if job.payload_json is not None:
        return job.payload_json
    return json.dumps(job.payload, allow_nan=False)


def _explain_pooler(error: BaseException) -> None:
    """Raise :class:`NotConfigured` naming the fix if *error* is a prepared statement
    lost behind a transaction-mode pooler (see ``prepare_engine``)."""
    if type(error).__name__ == "InvalidSqlStatementName":
        raise NotConfigured(POOLER_PREPARED_STATEMENTS) from error


#: About how much of results and error texts one acknowledgement statement carries:
#: far below PostgreSQL's 1 GB limit on a parameter (each column is one array), and
#: large enough that a batch of usual outcomes is one statement.
ACK_CHUNK_BYTES = 16_000_000


def _ack_bytes(row: tuple[Ack, str | None]) -> int:
    """An acknowledgement's large values: its error text and its result's JSON."""
    ack, result = row
    return len(ack.last_error or "") + len(result or "")


def _ack_params(
    rows: Sequence[tuple[Ack, str | None]], now: datetime, actor: str, history: bool
) -> dict[str, Any]:
    """The batch acknowledgement's binds for *rows*, one array per column."""
    params: dict[str, Any] = {
        "now": now,
        "ids": [a.job_id for a, _ in rows],
        "tokens": [a.claim_token for a, _ in rows],
        "statuses": [a.status for a, _ in rows],
        "run_ats": [a.run_at for a, _ in rows],
        "due_ats": [a.due_at for a, _ in rows],
        "deltas": [a.attempts_delta for a, _ in rows],
        "errors": [a.last_error for a, _ in rows],
        "results": [result for _, result in rows],
    }
    if history:
        params.update(
            actor=actor,
            events=[a.event for a, _ in rows],
            attempts=[a.attempt for a, _ in rows],
        )
    return params


def _fetch_all(
    conn: Connection, sql: str, params: dict[str, Any] | tuple[Any, ...]
) -> list[Any]:
    """*sql*'s rows, run on *conn*'s psycopg cursor in *conn*'s transaction (or
    autocommit), for the claim and the one-job insert.

    Past SQLAlchemy's execution, which described and matched the claim's 35 result
    columns anew on every call (``exec_driver_sql`` caches no metadata): that and its
    row-by-row fetching were a third of a claim's CPU in a drain (profiled; 480-538
    against 349-381 µs a claim of 20 this way). What SQLAlchemy would do on an error
    is kept: the pooler's lost prepared statement names its fix, a lost connection is
    invalidated so the pool never hands it out again, and the error is SQLAlchemy's
    (the worker's loop catches ``SQLAlchemyError``). psycopg prepares the statement as
    it does for SQLAlchemy: by the connection's own ``prepare_threshold``.

    An engine someone watches (:mod:`..watching`: SQL logging, tracing
    instrumentation) runs the statement through SQLAlchemy instead, so the watcher
    still sees every claim and insert.
    """
    if watched(conn):
        return list(conn.exec_driver_sql(sql, params))
    pooled = conn.connection
    driver: Any = pooled.driver_connection
    dialect = conn.dialect
    try:
        with driver.cursor() as cursor:
            cursor.execute(sql, params)
            rows: list[Any] = cursor.fetchall()
            return rows
    except dialect.loaded_dbapi.Error as error:
        _explain_pooler(error)
        lost = dialect.is_disconnect(error, pooled.dbapi_connection, None)
        if lost:
            conn.invalidate(error)
        raise sqlalchemy_error(conn, sql, params, error, invalidated=lost) from error
