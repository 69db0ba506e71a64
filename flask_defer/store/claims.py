"""The worker's statements: claim, acknowledge, leases, reclaim, prune, LISTEN.

Acknowledgements are compare-and-set on the claim token, so a worker whose lease
lapsed can never overwrite the outcome of the worker that took the job over.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    String,
    and_,
    bindparam,
    delete,
    func,
    insert,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.exc import OperationalError

from ..jobs import Job, JobStatus
from ..schema import UTCDateTime
from .history import HistoryStatements
from .records import (
    NOTIFY_CHANNEL,
    Ack,
    HistoryEvent,
)


class ClaimStatements(HistoryStatements):
    """The worker's statements: claim, acknowledge, leases, reclaim, prune, LISTEN."""

    def claim(
        self,
        *,
        now: datetime,
        limit: int,
        token: str,
        lease_until: datetime,
        queues: Collection[str] | None = None,
        actor: str = "app",
        spend_attempt: bool = True,
    ) -> list[Job]:
        """Atomically move up to *limit* due pending jobs to running and return them.

        PostgreSQL: ``FOR UPDATE SKIP LOCKED`` lets many workers claim side by side
        without ever taking the same row. SQLite: one ``UPDATE ... RETURNING`` inside
        ``BEGIN IMMEDIATE``, serialised by the database's single write lock.

        ``spend_attempt=False`` claims without counting an attempt: for jobs a worker
        queues beside its running ones, whose attempt :meth:`start_claimed` counts
        when a handler really starts. A worker killed before that leaves them with
        their attempts untouched.
        Each claimed job's ``started`` event, by *actor*, is written with the claim
        (only a claim that spends the attempt; :meth:`start_claimed` writes it for the
        others): on PostgreSQL by a data-modifying CTE of the same statement, on SQLite
        by one INSERT for the batch in the same transaction.
        """
        if self.is_sqlite:
            # Look before taking the write lock: an idle worker polling an empty
            # backlog must not make every web request's write wait for it.
            next_at = self.next_run_at(queues=queues)
            if next_at is None or next_at > now:
                return []
        stmt = self._claim_statement(tuple(queues) if queues else (), spend_attempt)
        params = {"now": now, "limit": limit, "token": token, "lease_until": lease_until}
        if self.is_postgres and self.history_table is not None and spend_attempt:
            params["actor"] = actor
        try:
            # PostgreSQL: the claim is one statement, so it runs as its own transaction
            # (no BEGIN and COMMIT round trips); SQLite takes the write lock first.
            with self.autocommit() if self.is_postgres else self.begin_immediate() as conn:
                rows = conn.execute(stmt, params).mappings().all()
                if self.is_sqlite and spend_attempt:
                    self.record_events(
                        conn,
                        [
                            HistoryEvent(row["id"], "started", now, actor, row["attempts"])
                            for row in rows
                        ],
                    )
        except OperationalError as error:
            if not self._lost_pending_index(error):
                raise
            return self.claim(
                now=now,
                limit=limit,
                token=token,
                lease_until=lease_until,
                queues=queues,
                actor=actor,
                spend_attempt=spend_attempt,
            )
        jobs = [Job.from_row(row) for row in rows]
        jobs.sort(key=lambda job: (job.run_at, job.id))
        return jobs

    def _claim_statement(self, queues: tuple[str, ...], spend_attempt: bool = True) -> Any:
        """The claim, built once per queue selection; now, limit, token, lease are binds.

        Its parts are kept apart on purpose (the conditions a due row meets, its order)
        so that priorities (``ORDER BY priority, run_at``) and paused queues (one more
        condition) extend this one statement rather than needing a second design.
        """
        key = (queues, spend_attempt)
        cached = self._claim_sql.get(key)
        if cached is not None:
            return cached
        t = self.table
        now = bindparam("now", type_=UTCDateTime())
        conditions: list[Any] = [self._is_pending(), t.c.run_at <= now]
        if queues:
            conditions.append(t.c.queue.in_(list(queues)))
        order = [t.c.run_at, t.c.id]
        due: Any = (
            select(t.c.id)
            .where(*conditions)
            .order_by(*order)
            .limit(bindparam("limit", type_=Integer()))
            .with_for_update(skip_locked=True)
        )
        if self.is_sqlite and self._sqlite_pending_index is not None:
            due = self._sqlite_due_ids(None, None, queues)
        values = {
            "status": JobStatus.RUNNING.value,
            "attempts": t.c.attempts + 1 if spend_attempt else t.c.attempts,
            "claim_token": bindparam("token", type_=String()),
            "lease_expires_at": bindparam("lease_until", type_=UTCDateTime()),
            "updated_at": now,
        }
        if self.is_postgres:
            # A materialised CTE runs the locking SELECT exactly once. As an IN (...)
            # subquery PostgreSQL may re-run it per row, claiming more than *limit*.
            due_cte = due.cte("due").prefix_with("MATERIALIZED")
            stmt = update(t).where(t.c.id == due_cte.c.id).values(values).returning(*t.c)
            if self.history_table is not None and spend_attempt:
                stmt = self._claim_recording_started(stmt, now)
        else:
            # No second "status = 'pending'" test on the outer UPDATE: the subquery
            # picks pending rows inside the same BEGIN IMMEDIATE transaction, which no
            # other writer can interleave with, and the extra term made SQLite walk
            # every pending row through the status index instead of looking the
            # chosen ids up by rowid.
            stmt = update(t).where(t.c.id.in_(due)).values(values).returning(*t.c)
        self._claim_sql[key] = stmt
        return stmt

    def _claim_recording_started(self, claim: Any, now: Any) -> Any:
        """PostgreSQL: the claim as a CTE, its rows' ``started`` events inserted beside it.

        ``WITH claimed AS (UPDATE ... RETURNING *), recorded AS (INSERT INTO history
        SELECT ... FROM claimed) SELECT * FROM claimed``: still one autocommit statement,
        so history costs the claim no extra round trip and cannot part from it.
        """
        h = self.history_table
        assert h is not None
        claimed = claim.cte("claimed")
        recorded = insert(h).from_select(
            ["job_id", "event", "at", "actor", "attempt"],
            select(
                claimed.c.id,
                literal_column("'started'"),
                now,
                bindparam("actor", type_=String()),
                claimed.c.attempts,
            ),
        ).cte("recorded")
        return select(claimed).add_cte(recorded)

    def start_claimed(self, job: Job, *, now: datetime, actor: str = "app") -> Job | None:
        """Count the attempt of a job claimed with ``spend_attempt=False``, as it starts.

        Returns the job with its new ``attempts``, or None when this claim no longer
        owns it (its lease lapsed while it waited): then it must not run here. Its
        ``started`` event, by *actor*, is written in the same transaction.
        """
        t = self.table
        stmt = (
            self._guarded_ack(job)
            .values(attempts=t.c.attempts + 1, updated_at=now)
            .returning(t.c.attempts)
        )
        with self.begin() as conn:
            attempts = conn.execute(stmt).scalar()
            if attempts is not None:
                started = HistoryEvent(job.id, "started", now, actor, int(attempts))
                self.record_events(conn, [started])
        return None if attempts is None else replace(job, attempts=int(attempts))

    def ack_done(
        self,
        job: Job,
        *,
        now: datetime,
        result: Any = None,
        conn: Connection | None = None,
        actor: str = "app",
        note: str | None = None,
    ) -> bool:
        """Mark a claimed job done; False if this claim no longer owns it.

        Pass *conn* to commit the mark together with the handler's own database work
        (``atomic=True`` handlers). *note* is kept as ``last_error`` (a warning about
        a run that succeeded).
        """
        values = self._settle_values(JobStatus.DONE, now)
        values.update(last_error=note, result=result)
        event = HistoryEvent(job.id, "done", now, actor, job.attempts, note)
        return self._acknowledge(job, values, now=now, event=event, conn=conn)

    def ack_retry(
        self, job: Job, *, now: datetime, run_at: datetime, error: str, actor: str = "app"
    ) -> bool:
        """Return a claimed job to pending at *run_at* after a failed attempt."""
        values = {"status": JobStatus.PENDING.value, "run_at": run_at, "last_error": error}
        event = HistoryEvent(job.id, "retried", now, actor, job.attempts, error, run_at)
        return self._acknowledge(job, values, now=now, event=event)

    def ack_failed(self, job: Job, *, now: datetime, error: str, actor: str = "app") -> bool:
        """Settle a claimed job as failed (out of attempts): the dead letter."""
        values = self._settle_values(JobStatus.FAILED, now)
        values["last_error"] = error
        event = HistoryEvent(job.id, "failed", now, actor, job.attempts, error)
        return self._acknowledge(job, values, now=now, event=event)

    def ack_snooze(
        self,
        job: Job,
        *,
        now: datetime,
        run_at: datetime,
        note: str | None,
        still_owed: bool,
        actor: str = "app",
    ) -> bool:
        """Return a claimed job to pending at *run_at* without spending its attempt.

        ``still_owed`` keeps ``due_at`` (the job is late, e.g. its handler is not
        deployed yet); otherwise the job counts as due only from *run_at* (``NotYet``).
        """
        t = self.table
        values: dict[str, Any] = {
            "status": JobStatus.PENDING.value,
            "run_at": run_at,
            "attempts": t.c.attempts - 1,
            "last_error": note,
        }
        if not still_owed:
            values["due_at"] = run_at
        event = HistoryEvent(job.id, "snoozed", now, actor, job.attempts, note, run_at)
        return self._acknowledge(job, values, now=now, event=event)

    def acknowledge_many(
        self, acks: Sequence[Ack], *, now: datetime, actor: str = "app"
    ) -> set[int]:
        """Write a batch of outcomes; return the ids whose claim still owned the row.

        Compare-and-set per row, as a single acknowledgement: a row is changed only if
        it is still ``running`` under the ack's claim token, so a worker whose lease
        lapsed changes nothing, and an id missing from the answer is a lost claim.
        PostgreSQL: one statement over the whole batch (``UPDATE ... FROM unnest(...)
        ... RETURNING id``) on an autocommit connection: one round trip and one commit
        for any number of jobs. SQLite: one prebuilt UPDATE per row, all in one
        ``BEGIN IMMEDIATE`` transaction: one commit (one fsync) for the batch.

        The history events of the rows still owned (``done``, ``failed``, ``retried``,
        ``snoozed``, by *actor*) are written with them: on PostgreSQL in the same
        statement (the UPDATE as a CTE, an INSERT ... SELECT from its RETURNING), on
        SQLite as one INSERT for the batch in the same transaction.
        """
        if not acks:
            return set()
        if self.is_postgres:
            return self._acknowledge_many_pg(acks, now, actor)
        return self._acknowledge_many_sqlite(acks, now, actor)

    def _acknowledge_many_pg(self, acks: Sequence[Ack], now: datetime, actor: str) -> set[int]:
        # The batch statement never waits for a row lock: rows another transaction
        # holds (an app's UPDATE that re-checked our row under READ COMMITTED keeps a
        # lock on it until it ends) are skipped and answered "busy". Waiting there
        # while holding the batch's other rows could close a deadlock with that
        # transaction; instead each busy row is written alone afterwards, holding
        # nothing else, as single acknowledgements always were.
        history = self.history_table is not None
        sql = self._ack_sql.get("pg+history" if history else "pg")
        if sql is None:
            sql = self._ack_many_pg_sql(history)
        params = {
            "now": now,
            "ids": [a.job_id for a in acks],
            "tokens": [a.claim_token for a in acks],
            "statuses": [a.status for a in acks],
            "run_ats": [a.run_at for a in acks],
            "due_ats": [a.due_at for a in acks],
            "deltas": [a.attempts_delta for a in acks],
            "errors": [a.last_error for a in acks],
            "results": [_result_json(a) for a in acks],
        }
        if history:
            params.update(
                actor=actor, events=[a.event for a in acks], attempts=[a.attempt for a in acks]
            )
        with self.autocommit() as conn:
            answer = [(int(row[0]), bool(row[1])) for row in conn.exec_driver_sql(sql, params)]
        owned = {job_id for job_id, written in answer if written}
        busy = {job_id for job_id, written in answer if not written}
        for ack in acks:
            if ack.job_id in busy and self._acknowledge_one_pg(ack, now, actor):
                owned.add(ack.job_id)
        return owned

    def _acknowledge_one_pg(self, ack: Ack, now: datetime, actor: str) -> bool:
        """One acknowledgement on its own (it may wait for the row; it holds no other)."""
        t = self.table
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
        if self.history_table is None:
            with self.autocommit() as conn:
                return int(conn.execute(stmt).rowcount) == 1
        with self.begin() as conn:
            if int(conn.execute(stmt).rowcount) != 1:
                return False
            event = HistoryEvent(
                ack.job_id, ack.event, now, actor, ack.attempt, ack.last_error, ack.run_at
            )
            self.record_events(conn, [event])
            return True

    def _ack_many_pg_sql(self, history: bool) -> str:
        """The batched acknowledgement; with *history*, its events' INSERT rides along."""
        t = self._quoted_table
        extra_arrays = ", %(events)s::text[], %(attempts)s::int[]" if history else ""
        extra_names = ", event, attempt" if history else ""
        returning = ", v.event, v.attempt, v.last_error, v.run_at" if history else ""
        recorded = ""
        if history:
            assert self.history_table is not None
            quoted = self.engine.dialect.identifier_preparer.format_table(self.history_table)
            recorded = (
                f", recorded AS (INSERT INTO {quoted} (job_id, event, at, actor, attempt,"
                " error, run_at) SELECT id, event, %(now)s, %(actor)s, attempt, last_error,"
                " run_at FROM written)"
            )
        sql = (
            "WITH v AS (SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::text[],"
            " %(statuses)s::text[], %(run_ats)s::timestamptz[], %(due_ats)s::timestamptz[],"
            f" %(deltas)s::int[], %(errors)s::text[], %(results)s::text[]{extra_arrays})"
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
            f" FROM v, mine WHERE t.id = v.id AND t.id = mine.id RETURNING t.id{returning})"
            f"{recorded}"
            " SELECT id, true FROM written"
            f" UNION ALL SELECT t.id, false FROM {t} AS t JOIN v ON t.id = v.id"
            " AND t.claim_token = v.token WHERE t.status = 'running'"
            " AND t.id NOT IN (SELECT id FROM mine)"
        )
        self._ack_sql["pg+history" if history else "pg"] = sql
        return sql

    def _acknowledge_many_sqlite(
        self, acks: Sequence[Ack], now: datetime, actor: str
    ) -> set[int]:
        sql = self._ack_sql.get("sqlite")
        if sql is None:
            sql = self._ack_sql["sqlite"] = (
                f"UPDATE {self._quoted_table} SET"
                " status = ?, run_at = COALESCE(?, run_at), due_at = COALESCE(?, due_at),"
                " attempts = attempts + ?, last_error = ?,"
                " result = CASE WHEN ? = 'done' THEN ? ELSE result END,"
                " finished_at = CASE WHEN ? IN ('done', 'failed') THEN ? ELSE finished_at END,"
                " claim_token = NULL, lease_expires_at = NULL, updated_at = ?"
                " WHERE id = ? AND claim_token = ? AND status = 'running'"
            )
        stamp = self._sqlite_time
        at = stamp(now)
        owned: set[int] = set()
        with self.begin_immediate() as conn:
            for a in acks:
                params = (
                    a.status,
                    stamp(a.run_at),
                    stamp(a.due_at),
                    a.attempts_delta,
                    a.last_error,
                    a.status,
                    _result_json(a),
                    a.status,
                    at,
                    at,
                    a.job_id,
                    a.claim_token,
                )
                if conn.exec_driver_sql(sql, params).rowcount == 1:
                    owned.add(a.job_id)
            self.record_events(
                conn,
                [
                    HistoryEvent(
                        a.job_id, a.event, now, actor, a.attempt, a.last_error, a.run_at
                    )
                    for a in acks
                    if a.job_id in owned
                ],
            )
        return owned

    def release(
        self,
        jobs: Sequence[Job],
        *,
        now: datetime,
        keep_run_at: bool = False,
        spent: bool = True,
    ) -> int:
        """Hand claimed jobs back to pending, attempt not spent (shutdown, ``run_due``).

        They are due now, or at their old ``run_at`` with ``keep_run_at``. ``spent``
        says their claim counted an attempt, which is given back; jobs claimed with
        ``spend_attempt=False`` and never started pass ``spent=False``. Their ``started``
        event goes too, when the claim wrote one: the handler was never given the job.
        """
        t = self.table
        values: dict[str, Any] = {
            "status": JobStatus.PENDING.value,
            "attempts": t.c.attempts - 1 if spent else t.c.attempts,
            "claim_token": None,
            "lease_expires_at": None,
            "updated_at": now,
        }
        if not keep_run_at:
            values["run_at"] = now
        released: list[Job] = []
        with self.begin() as conn:
            for job in jobs:
                if conn.execute(self._guarded_ack(job).values(values)).rowcount == 1:
                    released.append(job)
            if spent:
                self._forget_started(conn, released)
        return len(released)

    def extend_leases(self, jobs: Sequence[Job], *, now: datetime, lease_until: datetime) -> int:
        """Heartbeat: push the lease of still-owned claims to *lease_until*."""
        if not jobs:
            return 0
        t = self.table
        owned = [and_(t.c.id == job.id, t.c.claim_token == job.claim_token) for job in jobs]
        stmt = (
            update(t)
            .where(t.c.status == JobStatus.RUNNING.value)
            .where(or_(*owned))
            .values(lease_expires_at=lease_until, updated_at=now)
        )
        with self.begin() as conn:
            return int(conn.execute(stmt).rowcount)

    def reclaim_lapsed(self, *, now: datetime, actor: str = "app") -> tuple[int, int]:
        """Return jobs whose lease lapsed to pending (or failed when out of attempts).

        The attempt the crashed worker started stays counted, so a job that kills its
        worker every time ends as a dead letter instead of looping forever. Each job
        gets a ``reclaimed`` event by *actor* naming the worker that lost it (the
        actor of its last ``started``), and ``failed`` too when it was out of attempts.
        """
        t = self.table
        lapsed = (t.c.status == JobStatus.RUNNING.value) & (t.c.lease_expires_at < now)
        note = "lease lapsed: the worker running this job stopped renewing it"
        with self.begin_immediate() as conn:
            failed = conn.execute(
                update(t)
                .where(lapsed, t.c.attempts >= t.c.max_attempts)
                .values({**self._settle_values(JobStatus.FAILED, now), "last_error": note})
                .returning(t.c.id, t.c.attempts)
            ).all()
            returned = conn.execute(
                update(t)
                .where(lapsed)
                .values(
                    status=JobStatus.PENDING.value,
                    run_at=now,
                    claim_token=None,
                    lease_expires_at=None,
                    last_error=note,
                    updated_at=now,
                )
                .returning(t.c.id, t.c.attempts)
            ).all()
            if returned:
                self.notify(conn, "default")
            if self.history_table is not None and (failed or returned):
                self._record_reclaimed(conn, now, actor, note, returned=returned, failed=failed)
        return len(returned), len(failed)

    def _record_reclaimed(
        self,
        conn: Connection,
        now: datetime,
        actor: str,
        note: str,
        *,
        returned: Sequence[Any],
        failed: Sequence[Any],
    ) -> None:
        lost_by = self._last_started_by(conn, [int(r[0]) for r in (*returned, *failed)])
        events: list[HistoryEvent] = []
        for job_id, attempts in (*returned, *failed):
            worker = lost_by.get(int(job_id), "an unknown worker")
            why = f"lease lapsed: {worker} stopped renewing it"
            events.append(HistoryEvent(int(job_id), "reclaimed", now, actor, attempts, why, now))
        events.extend(
            HistoryEvent(int(job_id), "failed", now, actor, attempts, note)
            for job_id, attempts in failed
        )
        self.record_events(conn, events)

    def prune(
        self,
        *,
        settled_before: datetime,
        failed_before: datetime,
        batch_size: int = 1000,
        max_batches: int | None = None,
    ) -> int:
        """Delete settled rows older than the retention, in batches; return how many.

        ``max_batches`` bounds one call, so a worker catching up on a huge backlog of
        history goes back to claiming jobs between rounds.
        """
        t = self.table
        old = (
            (t.c.status.in_([JobStatus.DONE.value, JobStatus.CANCELLED.value]))
            & (t.c.finished_at < settled_before)
        ) | ((t.c.status == JobStatus.FAILED.value) & (t.c.finished_at < failed_before))
        total = 0
        batches = 0
        while True:
            batch = select(t.c.id).where(old).limit(batch_size).scalar_subquery()
            with self.begin_immediate() as conn:
                # The job's history goes in the same transaction as the job.
                gone = conn.execute(delete(t).where(t.c.id.in_(batch)).returning(t.c.id))
                ids = [int(job_id) for job_id in gone.scalars()]
                self._forget_history(conn, ids)
                deleted = len(ids)
            total += deleted
            batches += 1
            if deleted < batch_size or (max_batches is not None and batches >= max_batches):
                return total

    @contextmanager
    def maintenance_lock(self) -> Iterator[bool]:
        """Yield True in the one worker that may reclaim and prune right now.

        PostgreSQL: a transaction-scoped advisory lock, tried without waiting, held on
        a connection of its own for the duration of the block and released by its
        commit, or by the server if this worker dies. SQLite: always True; its
        writes are serialised anyway and reclaim/prune are guarded statements.
        """
        if not self.is_postgres:
            yield True
            return
        with self.engine.connect() as conn, conn.begin():
            locked = conn.execute(
                select(func.pg_try_advisory_xact_lock(self._maintenance_lock_key()))
            ).scalar()
            yield bool(locked)

    def _maintenance_lock_key(self) -> int:
        # One lock per jobs table, so two apps sharing a database do not exclude
        # each other. crc32 fits PostgreSQL's bigint key and is stable across runs.
        return zlib.crc32(f"flask_defer:{self.table.name}".encode())

    @property
    def can_listen(self) -> bool:
        """True when workers can LISTEN for NOTIFY (PostgreSQL through psycopg 3)."""
        return self.is_postgres and self.engine.dialect.driver == "psycopg"

    def open_listener(self) -> Any:
        """A dedicated psycopg connection, in autocommit, LISTENing on the channel.

        Taken from the engine (so it has the app's credentials and connect options)
        and detached from its pool: it lives as long as the worker and is closed by
        the caller. PostgreSQL only.
        """
        if not self.can_listen:
            raise RuntimeError("LISTEN needs PostgreSQL through psycopg 3")
        pooled = self.engine.raw_connection()
        conn: Any = pooled.driver_connection
        pooled.detach()
        try:
            conn.rollback()
            conn.autocommit = True
            conn.execute(f'LISTEN "{NOTIFY_CHANNEL}"')
        except BaseException:
            conn.close()
            raise
        return conn


def _result_json(ack: Ack) -> str | None:
    """The stored form of a done ack's result: JSON text, as the JSON column writes it."""
    if ack.status != JobStatus.DONE.value:
        return None
    return json.dumps(ack.result, allow_nan=False)
