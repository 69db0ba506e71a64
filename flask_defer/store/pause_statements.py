"""Paused queues and job names: the pauses table and queue counts.

A pause is a row (``kind`` = ``queue`` or ``name``, ``value``) in ``<jobs>_pauses``.
The claim and ``next_run_at`` add "neither its queue nor its name is paused" to what a
due row must meet (``claim_sql.claimable``: ``queue NOT IN (SELECT value ...)``,
uncorrelated subqueries over a table of a few rows, which PostgreSQL hashes once per
statement and SQLite materialises once), so a paused queue's or name's jobs are
never claimed: they stay pending with their ``run_at`` and ``due_at`` (health still
counts them as owed once due), and a running job finishes normally. Resuming deletes
the row and, on PostgreSQL, notifies the workers in the same transaction, so they
claim at once rather than at their next poll.

Pausing and resuming are single guarded statements (``INSERT ... ON CONFLICT DO
NOTHING``, ``DELETE ... WHERE``): their answer says whether *this* call changed it.
On SQLite they take the write lock, which the claim holds too, so no claim that
starts after a pause commits can take that queue's jobs; on PostgreSQL a claim
statement already running when the pause commits may still start the jobs it took.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    String,
    bindparam,
    column,
    delete,
    select,
    text,
)
from sqlalchemy.exc import OperationalError, ProgrammingError

from ..errors import InvalidArgument
from .core import StoreBase, logger
from .records import Pause, QueueCounts
from .schema import PAUSE_KINDS, UTCDateTime


class PauseStatements(StoreBase):
    """Pause and resume a queue or a job name; queue counts."""

    _queue_counts_sql: Any = None
    #: True once the pauses table was found missing (an old schema; see :meth:`paused`).
    _warned_no_pauses: bool = False

    def pause(self, *, kind: str, value: str, now: datetime, actor: str) -> bool:
        """Pause the queue or job name *value*: True if this call paused it.

        Already paused → False, and the first pause's time and actor are kept. The jobs
        stay pending; no claim that starts after this commits takes them.
        """
        p = self.pauses_table
        row = {"kind": _checked_kind(kind), "value": value, "paused_at": now, "actor": actor}
        stmt = (
            self.driver.insert_ignoring(p)
            .values(row)
            .on_conflict_do_nothing(index_elements=[p.c.kind, p.c.value])
            .returning(p.c.kind)
        )
        with self.begin_immediate() as conn:
            # RETURNING, not rowcount: a row back means this statement inserted it.
            return conn.execute(stmt).first() is not None

    def resume(
        self, *, kind: str, value: str, wake: Collection[str] = ()
    ) -> bool:
        """Lift the pause of the queue or job name *value*: True if this call lifted it.

        Not paused → False. On PostgreSQL the workers are notified when it commits: those
        of the queue *value* (``kind="queue"``), or of the queues in *wake* (a name's
        jobs are in its handler's queue), so they claim the waiting jobs at once.
        """
        p = self.pauses_table
        stmt = delete(p).where(p.c.kind == _checked_kind(kind), p.c.value == value)
        with self.begin_immediate() as conn:
            resumed = bool(conn.execute(stmt).rowcount == 1)
            if resumed:
                for queue in sorted({value, *wake} if kind == "queue" else set(wake)):
                    self.notify(conn, queue)
        return resumed

    def paused(self, conn: Connection | None = None) -> list[Pause]:
        """Every pause, queues first, each kind by value.

        In *conn* when given, else in a connection of its own. A database without the
        table (a schema older than ``flask_defer_0007``, which the web keeps serving)
        has no pauses: ``[]``, with one warning.
        """
        p = self.pauses_table
        stmt = select(p.c.kind, p.c.value, p.c.paused_at, p.c.actor).order_by(
            p.c.kind.desc(), p.c.value
        )
        try:
            if conn is not None:
                rows = conn.execute(stmt).all()
            else:
                with self.engine.connect() as own:
                    rows = own.execute(stmt).all()
        except (OperationalError, ProgrammingError) as error:
            if self._pauses_table_exists():
                raise
            if not self._warned_no_pauses:
                logger.warning("no pauses table (%s); upgrade the schema", error.orig)
                self._warned_no_pauses = True
            return []
        return [Pause(str(k), str(v), at, str(actor)) for k, v, at, actor in rows]

    def queue_counts(
        self, conn: Connection, *, now: datetime, cap: int
    ) -> tuple[list[QueueCounts], frozenset[str]]:
        """Per queue: pending jobs due, pending jobs not due yet, running jobs.

        Each figure is counted over at most *cap* rows of its partial index (the
        soonest pending ones, the running ones by lease), so the dashboard never reads
        more than three times *cap* rows however long a backlog is. The second value
        names the figures (``due``, ``scheduled``, ``running``) that reached the cap:
        for those every count is "at least".
        """
        rows = conn.execute(self._queue_counts_statement(), {"now": now, "window": cap + 1})
        found: dict[str, dict[str, int]] = {}
        totals: dict[str, int] = {}
        for kind, queue, n in rows:
            found.setdefault(queue, {})[kind] = int(n)
            totals[kind] = totals.get(kind, 0) + int(n)
        counts = [
            QueueCounts(
                queue=queue,
                due=figures.get("due", 0),
                scheduled=figures.get("scheduled", 0),
                running=figures.get("running", 0),
            )
            for queue, figures in sorted(found.items())
        ]
        return counts, frozenset(kind for kind, n in totals.items() if n > cap)

    def _queue_counts_statement(self) -> Any:
        """The statement of :meth:`queue_counts`, built once; binds ``now`` and ``window``.

        Text, like the health counts, so SQLite can be told the partial pending index
        (``INDEXED BY``); each part states its status as a literal, the predicate of the
        partial index it reads.
        """
        cached = self._queue_counts_sql
        if cached is not None:
            return cached
        jobs = self._quoted_table
        by_time = jobs + self.driver.index_hint(f"ix_{self.table.name}_pending_run_at_name")
        # The predicate of that partial index: pending and not waiting for parents.
        ready = "status = 'pending' AND waiting_for IS NULL"
        parts = [
            ("due", by_time, f"{ready} AND run_at <= :now", "run_at"),
            ("scheduled", by_time, f"{ready} AND run_at > :now", "run_at"),
            ("running", jobs, "status = 'running'", "lease_expires_at"),
        ]
        sql = " UNION ALL ".join(
            f"SELECT '{kind}' AS kind, queue, count(*) AS n FROM (SELECT queue FROM {source}"
            f" WHERE {where} ORDER BY {order} LIMIT :window) AS {kind}_rows GROUP BY queue"
            for kind, source, where, order in parts
        )
        cached = (
            text(sql)
            .bindparams(
                bindparam("now", type_=UTCDateTime()), bindparam("window", type_=Integer())
            )
            .columns(column("kind", String()), column("queue", String()), column("n", Integer()))
        )
        self._queue_counts_sql = cached
        return cached

    def _pauses_table_exists(self) -> bool:
        with self.engine.connect() as conn:
            return bool(self.engine.dialect.has_table(conn, self.pauses_table.name))


def _checked_kind(kind: str) -> str:
    if kind not in PAUSE_KINDS:
        raise InvalidArgument("kind", f"expected 'queue' or 'name', got {kind!r}")
    return kind
