"""Batch appends: items joining one pending job per (name, key) window.

An append is a guarded update of the open batch or the insert of a new one, so items
racing the worker's claim land in exactly one batch.

**Lock order on PostgreSQL.** The worker's claim locks due rows in ``run_at`` order
with ``FOR UPDATE SKIP LOCKED``, but SKIP LOCKED does not cover a row updated since the
claim's snapshot: PostgreSQL then waits for whoever holds the newer version ("while
locking updated version of tuple"). A producer walks a key's slots in slot order, so
it could hold one batch row (retired or appended to, or only re-checked: an UPDATE
that waited and then found the row no longer matching keeps its lock) and wait for
another that the claim had locked first, while the claim waited for it: a deadlock
between ``batch()`` and the worker. So on PostgreSQL a producer waits for a batch row
only in its first statement, the append to the open batch of slot 1, while it holds
no batch row; when that finds nothing it takes the key's advisory lock
(:meth:`BatchStatements.batch_lock`, so producers of one key take turns on the slow
path and do not race each other for rows there), and every later append and retire
picks its row with ``FOR UPDATE SKIP LOCKED`` (a row the worker holds is being
claimed: it takes no more items, and the next slot is used).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Integer,
    String,
    Text,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    select,
    update,
)

from ..jobs import Job, JobStatus
from .history import HistoryStatements
from .records import (
    BatchAppend,
    NewJob,
)
from .schema import UTCDateTime

#: A stand-in job, only to learn the column names an insert binds.
_PROBE = NewJob(name="", payload={}, run_at=datetime(2000, 1, 1, tzinfo=UTC), max_attempts=1)


class BatchStatements(HistoryStatements):
    """Batch appends: items joining one pending job per (name, key) window."""

    def batch_lock(self, conn: Connection, *, name: str, key: str) -> None:
        """Take the (name, key) batch lock for the rest of *conn*'s transaction.

        Producers of one key then append one after the other, as they would queue for
        the open batch's row anyway, and the slot statements below never wait for each
        other's rows. A transaction-level advisory lock, released at commit or
        rollback; a hash collision only makes two keys take turns. SQLite has one
        writer at a time and needs nothing.
        """
        self.driver.lock_batch_key(conn, f"{self.table.name}\x1f{name}\x1f{key}")

    def batch_append(
        self,
        conn: Connection,
        *,
        name: str,
        key: str,
        item_json: str,
        now: datetime,
        max_items: int | None,
        debounce_until: datetime | None,
        wait: bool = False,
    ) -> BatchAppend | None:
        """Append one item to the pending batch job *name* holding *key*, in one statement.

        PostgreSQL: a row another transaction holds is passed over (None), unless
        *wait*, which only a statement holding no batch row yet may ask for (see the
        module docstring).

        The guard (``status = 'pending'`` and, with *max_items*, "not full yet") makes
        the append and the worker's claim exclusive: an item lands in a batch before it
        is claimed, or the update touches nothing and the caller starts a new batch.
        *item_json* is the item as JSON text. ``debounce_until`` moves ``run_at`` there,
        but never past the batch's ``flush_by`` (its ``max_wait`` deadline); a batch
        that reaches *max_items* is made due at once and its key becomes
        ``<key>#full-<id>``. ``None`` when no such row accepts the item, which includes
        a batch already due at *now*.
        """
        params: dict[str, Any] = {"b_name": name, "b_key": key, "b_item": item_json, "b_now": now}
        if max_items is not None:
            params["b_max_items"] = max_items
        if debounce_until is not None:
            params["b_until"] = debounce_until
        variant = ("append", max_items is not None, debounce_until is not None, wait)
        stmt = self._batch_sql.get(variant)
        if stmt is None:
            stmt = self._batch_sql[variant] = self._append_statement(*variant[1:])
        row = conn.execute(stmt, params).first()
        if row is None:
            return None
        result = BatchAppend(job_id=int(row[0]), run_at=row[1], items=int(row[3]))
        if result.run_at <= now:
            # Full: wake a sleeping worker now rather than at its next poll.
            self.notify(conn, row[2])
        return result

    def _append_statement(self, limited: bool, debounced: bool, wait: bool) -> Any:
        """The guarded UPDATE of :meth:`batch_append`, built once per variant.

        Every value is a bound parameter (``b_name``, ``b_key``, ``b_item``, ``b_now``,
        and ``b_max_items`` or ``b_until`` where the variant has them): building the
        statement and its cache key anew for each item was most of an append's Python
        (cProfile on SQLite: about 3 ms of the 2,963 µs ``batch()`` took; 475 µs now).
        Threads may build a variant at once; either copy serves, as both are the same.
        """
        # Long on purpose: one guarded UPDATE; splitting it would hide which conditions
        # the single statement checks together. The JSON expressions are the driver's.
        t = self.table
        now = bindparam("b_now", type_=UTCDateTime())
        json_items = self.driver.batch_items(t, bindparam("b_item", type_=Text()))
        count_before, appended = json_items.count_before, json_items.appended
        count_after, flush_by, earliest = (
            json_items.count_after, json_items.flush_by, json_items.earliest
        )
        run_at: ColumnElement[Any] = t.c.run_at
        if debounced:
            candidate = bindparam("b_until", type_=UTCDateTime())
            run_at = earliest(candidate, func.coalesce(flush_by, candidate))
        conditions = [
            t.c.key == bindparam("b_key", type_=t.c.key.type),
            t.c.name == bindparam("b_name", type_=t.c.name.type),
            t.c.status == JobStatus.PENDING.value,
            # A batch that is due belongs to the worker. On PostgreSQL every append
            # locks the row until its transaction commits, and the claim's SKIP LOCKED
            # passes over a locked row, so a busy key's appenders would keep an
            # overdue batch from ever being claimed; on SQLite each append is one more
            # writer ahead of the claim in the queue for the write lock. Late items
            # open the next batch, on both, so a due batch stops growing.
            t.c.run_at > now,
        ]
        values: dict[str, Any] = {"payload": appended, "updated_at": now}
        if limited:
            max_items = bindparam("b_max_items", type_=Integer())
            conditions.append(count_before < max_items)
            full = count_before + 1 >= max_items
            run_at = case((full, now), else_=run_at)
            # A full batch gives its key up (renamed after its id), so the next item
            # can open a new batch in the same slot while this one waits for a worker.
            values["key"] = case(
                (full, t.c.key + literal_column("'#full-'") + cast(t.c.id, String())),
                else_=t.c.key,
            )
        values["run_at"] = run_at
        return (
            update(t)
            .where(*(conditions if wait else self._unlocked_row(conditions)))
            .values(values)
            .returning(t.c.id, t.c.run_at, t.c.queue, count_after)
        )

    def batch_retire_due(self, conn: Connection, *, name: str, key: str, now: datetime) -> bool:
        """Move a due, unclaimed batch out of its slot (key ``<key>#due-<id>``); True if one was.

        A batch that is due takes no more items (see :meth:`batch_append`), so the slot
        it holds is only in the way of the next batch. It keeps its run_at and is
        claimed like any due job; one write per due batch, by the item that needs
        the slot, instead of every later item locking it.
        """
        variant = ("retire", False, False, False)
        stmt = self._batch_sql.get(variant)
        if stmt is None:
            t = self.table
            conditions = [
                t.c.key == bindparam("b_key", type_=t.c.key.type),
                t.c.name == bindparam("b_name", type_=t.c.name.type),
                t.c.status == JobStatus.PENDING.value,
                t.c.run_at <= bindparam("b_now", type_=UTCDateTime()),
            ]
            stmt = self._batch_sql[variant] = (
                update(t)
                .where(*self._unlocked_row(conditions))
                .values(key=t.c.key + literal_column("'#due-'") + cast(t.c.id, String()))
            )
        params = {"b_key": key, "b_name": name, "b_now": now}
        return bool(conn.execute(stmt, params).rowcount)

    def _unlocked_row(self, conditions: list[ColumnElement[bool]]) -> list[ColumnElement[bool]]:
        """*conditions* narrowed to the one matching row no one else holds (where rows
        lock one by one: PostgreSQL).

        ``id = (SELECT id ... LIMIT 1 FOR UPDATE SKIP LOCKED)``: one row at most (the
        live-key index allows one pending row per key), skipped rather than waited
        for when another transaction (the worker's claim) holds it, so the producer
        never waits while holding another batch row (see the module docstring).
        Where writes are serialised (SQLite): unchanged, as no row is ever held.
        """
        if self.driver.serialises_writes:
            return conditions
        t = self.table
        row = self.driver.skip_locked(select(t.c.id).where(*conditions).limit(1))
        return [t.c.id == row.scalar_subquery(), *conditions]

    def hold_claim(self, conn: Connection, job: Job) -> bool:
        """Lock a claimed job's row in the caller's transaction; False if the claim is lost.

        An ``atomic=True`` handler calls this first, so its transaction takes the job
        row before the rows it works on, in the same order as an undo (cancel, then the
        app's row): the two can wait for each other but never deadlock. SQLite has one
        writer at a time and needs no row lock; there it is only the ownership check.
        """
        t = self.table
        stmt = (
            select(t.c.id)
            .where(
                t.c.id == job.id,
                t.c.status == JobStatus.RUNNING.value,
                t.c.claim_token == job.claim_token,
            )
            .with_for_update()
        )
        return conn.execute(stmt).first() is not None
