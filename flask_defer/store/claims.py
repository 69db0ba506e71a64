"""The worker's claim, its look at when the next job is due, and its acknowledgements.

When the next claimable job is due (:meth:`ClaimStatements.next_run_at`, the SQLite
worker's poll and every worker's sleep) is answered with the claim's own rules
(``claim_sql``), so a worker never wakes for a job it may not start: of a paused queue
or name, expired, or of a concurrency key with no free slot.

The claim counts each claimed job's attempt and writes its ``started`` event in the
same statement: a worker claims only jobs it starts at once, so there is no separate
start to pay for, and a job that kills its worker has its attempt spent.

The claim commits without waiting for the disk. A claim only has to outlive the
*worker*, which it does once the database has it; a database crash or power loss
within a moment of a claim may forget it (the job, back to pending, runs again with
that attempt uncounted), so a job runs at most ``max_attempts`` plus one time per
database crash during its runs. Outcomes still wait for the disk, and the log is
written in order: a durable outcome makes every claim before it durable.

Acknowledgements are compare-and-set on the claim token, so a worker whose lease
lapsed can never overwrite the outcome of the worker that took the job over.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BindParameter,
    Connection,
    Integer,
    bindparam,
    column,
    func,
    select,
    text,
)
from sqlalchemy.exc import OperationalError

from ..jobs import Job
from .claim_sql import KEYED, KEYED_MEMORY, next_keyed_sql, next_unkeyed_sql
from .dependencies import DependencyStatements
from .records import Ack, HistoryEvent
from .schema import UTCDateTime

#: Seconds a claim trusts a look that found no keyed job pending.
KEYED_UNSEEN = 0.1


class ClaimStatements(DependencyStatements):
    """The worker's claim, when the next claimable job is due, and its acknowledgements."""

    def next_run_at(
        self, *, queues: Collection[str] | None = None, now: datetime | None = None
    ) -> datetime | None:
        """When the earliest job a claim could take is due (None: nothing pending).

        Jobs a claim leaves alone do not count: of a paused queue or name, expired (at
        *now*, default the current time), or of a ``concurrency_key`` with no free slot.
        This is the SQLite worker's poll, so it must cost the same with a million
        future rows as with ten: one step into the pending index per priority present
        (see ``claim_sql``), plus, while keyed jobs are about, a look at those.
        """
        params: dict[str, Any] = {"now": now if now is not None else datetime.now(UTC)}
        if queues:
            params["queues"] = list(queues)
        try:
            with self.engine.connect() as conn:
                # One round trip: the unkeyed answer and whether any keyed job is pending.
                row = conn.execute(self._next_statement("next", bool(queues)), params).one()
                found = [row.run_at]
                if row.keyed is not None or self._keyed_until > time.monotonic():
                    statement = self._next_statement("next-keyed", bool(queues))
                    found.append(conn.execute(statement, params).scalar())
        except OperationalError as error:
            if not self._lost_pending_index(error):
                raise
            return self.next_run_at(queues=queues, now=now)
        times = [at for at in found if at is not None]
        return min(times) if times else None

    def _next_statement(self, kind: str, queues: bool) -> Any:
        cached = self._claim_sql.get((kind, queues, None))
        if cached is not None:
            return cached
        tables = self.claim_tables()
        binds: list[BindParameter[Any]] = [bindparam("now", type_=UTCDateTime())]
        if queues:
            binds.append(bindparam("queues", expanding=True))
        columns: list[Any] = [column("run_at", UTCDateTime())]
        if kind == "next":
            sql = (
                f"SELECT ({next_unkeyed_sql(tables, queues=queues)}) AS run_at,"
                f" (SELECT 1 FROM {tables.jobs}{tables.keyed_hint} WHERE {KEYED} LIMIT 1)"
                " AS keyed"
            )
            columns.append(column("keyed", Integer()))
        else:
            sql = next_keyed_sql(tables, queues=queues)
        stmt = text(sql).bindparams(*binds).columns(*columns)
        self._claim_sql[(kind, queues, None)] = stmt
        return stmt

    def claim(
        self,
        *,
        now: datetime,
        limit: int,
        token: str,
        lease_until: datetime,
        queues: Collection[str] | None = None,
        actor: str = "app",
        look_first: bool = True,
    ) -> list[Job]:
        """Atomically move up to *limit* due pending jobs to running and return them.

        Jobs are taken by priority (lower first), then ``run_at``; a claim takes the due
        jobs of one priority (see ``claim_sql``). Jobs past their ``expires_at``, of
        paused queues or names, and of a ``concurrency_key`` at its limit are left.

        The driver runs it (:mod:`.driver`): PostgreSQL's ``FOR UPDATE SKIP LOCKED``
        lets many workers claim side by side without ever taking the same row;
        SQLite's ``UPDATE ... RETURNING`` inside ``BEGIN IMMEDIATE`` is serialised by
        the database's single write lock. Keyed jobs are claimed first, by a statement
        of their own that the driver serialises per table, so two workers never both
        fill a key's last slot.

        Each claimed job's attempt is counted and its ``started`` event, by *actor*,
        written with the claim, in the same statement or the same transaction. The
        commit does not wait for the disk (see the module's docstring).

        Where writes are serialised (SQLite), the claim first looks whether anything
        is due before taking the write lock, so an idle worker never makes the app's
        writes wait; ``look_first=False`` skips that read for a caller whose last
        claim came back full (a backlog).
        """
        if self.driver.serialises_writes and look_first:
            # Look before taking the write lock: an idle worker polling an empty
            # backlog must not make every web request's write wait for it.
            next_at = self.next_run_at(queues=queues, now=now)
            if next_at is None or next_at > now:
                return []
        params: dict[str, Any] = {
            "now": now,
            "limit": limit,
            "token": token,
            "lease_until": lease_until,
        }
        if queues:
            params["queues"] = list(queues)
        try:
            jobs = self.driver.claim(params, queues=bool(queues), actor=actor)
        except OperationalError as error:
            if not self._lost_pending_index(error):
                raise
            return self.claim(
                now=now, limit=limit, token=token, lease_until=lease_until,
                queues=queues, actor=actor, look_first=look_first,
            )  # fmt: skip
        if any(job.concurrency_key is not None for job in jobs):
            self.keyed_scheduled()
        jobs.sort(key=lambda job: (job.priority, job.run_at, job.id))
        return jobs

    def keyed_in_play(self, conn: Connection) -> bool:
        """Whether keyed jobs may be pending: a claim saw some (or this process scheduled
        one) lately, else one step into the keyed pending index.

        A "none" answer is trusted for a tenth of a second, so a busy worker pays for the
        look (a round trip on PostgreSQL) about ten times a second rather than once per
        claim; a keyed job scheduled by another process meanwhile waits that long at most.
        """
        remembered = self.keyed_remembered()
        if remembered is not None:
            return remembered
        moment = time.monotonic()
        found = conn.execute(self._keyed_probe()).first() is not None
        if found:
            self._keyed_until = moment + KEYED_MEMORY
        else:
            self._keyed_unseen_until = moment + KEYED_UNSEEN
        return found

    def keyed_remembered(self) -> bool | None:
        """What :meth:`keyed_in_play` would answer without a look, or None when it must
        look: a caller that would open a connection only for the look opens none."""
        moment = time.monotonic()
        if moment < self._keyed_until:
            return True
        if moment < self._keyed_unseen_until:
            return False
        return None

    def _keyed_probe(self) -> Any:
        cached = self._claim_sql.get(("keyed-probe", False, None))
        if cached is None:
            tables = self.claim_tables()
            sql = f"SELECT 1 FROM {tables.jobs}{tables.keyed_hint} WHERE {KEYED} LIMIT 1"
            cached = self._claim_sql[("keyed-probe", False, None)] = text(sql)
        return cached

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
        event = HistoryEvent(job.id, "done", now, actor, job.attempts, note)
        params = {"v_last_error": note, "v_result": result}
        return self._acknowledge(job, "done", params, now=now, event=event, conn=conn)

    def ack_aborted(self, job: Job, *, now: datetime, note: str | None, actor: str = "app") -> bool:
        """Settle a claimed job whose handler stopped on an abort request as
        ``cancelled``; its ``aborted`` event names who asked (*actor* if nobody did:
        the handler raised :class:`~flask_defer.Aborted` on its own). False if this
        claim no longer owns it. Its children are cancelled or released with it."""
        params = {"job_id": job.id, "token": job.claim_token, "now": now, "v_last_error": note}
        with self.begin() as conn:
            row = conn.execute(self._guarded_ack("aborted"), params).first()
            if row is None:
                return False
            by = row[1] or actor
            self.record_events(conn, [HistoryEvent(job.id, "aborted", now, by, job.attempts, note)])
            if row[0]:
                self.release_children(conn, [job.id], now=now, actor=by)
        return True

    def aborts_requested(self, jobs: Sequence[Job]) -> list[Job]:
        """Those of *jobs* (claimed runs) whose abort someone asked for: one read by
        primary key, what the heartbeat asks every ``ABORT_CHECK_SECONDS``."""
        if not jobs:
            return []
        t = self.table
        stmt = self._control_sql.get("aborts_requested")
        if stmt is None:
            stmt = self._control_sql["aborts_requested"] = select(t.c.id, t.c.claim_token).where(
                t.c.id.in_(bindparam("ids", expanding=True)),
                t.c.abort_requested_by.is_not(None),
            )
        with self.engine.connect() as conn:
            asked = {
                (int(i), token) for i, token in conn.execute(stmt, {"ids": [j.id for j in jobs]})
            }
        return [job for job in jobs if (job.id, job.claim_token) in asked]

    def ack_retry(
        self, job: Job, *, now: datetime, run_at: datetime, error: str, actor: str = "app"
    ) -> bool:
        """Return a claimed job to pending at *run_at* after a failed attempt."""
        event = HistoryEvent(job.id, "retried", now, actor, job.attempts, error, run_at)
        params = {"v_run_at": run_at, "v_last_error": error}
        return self._acknowledge(job, "retry", params, now=now, event=event)

    def ack_failed(self, job: Job, *, now: datetime, error: str, actor: str = "app") -> bool:
        """Settle a claimed job as failed (out of attempts): the dead letter."""
        event = HistoryEvent(job.id, "failed", now, actor, job.attempts, error)
        return self._acknowledge(job, "failed", {"v_last_error": error}, now=now, event=event)

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
        event = HistoryEvent(job.id, "snoozed", now, actor, job.attempts, note, run_at)
        params = {"v_run_at": run_at, "v_due_at": run_at, "v_last_error": note}
        kind = "snooze" if still_owed else "snooze_due"
        if still_owed:
            del params["v_due_at"]
        return self._acknowledge(job, kind, params, now=now, event=event)

    def _acknowledge(
        self,
        job: Job,
        kind: str,
        params: dict[str, Any],
        *,
        now: datetime,
        event: HistoryEvent,
        conn: Connection | None = None,
    ) -> bool:
        """One compare-and-set acknowledgement: the prebuilt statement *kind* (see
        :meth:`_guarded_ack`), its ``v_*`` values in *params*.

        Compare-and-set on the claim token: a worker whose lease lapsed (and whose job
        was reclaimed and perhaps finished elsewhere) changes nothing, and records
        nothing either: its event is written only if its update was.
        """
        stmt = self._guarded_ack(kind)
        bound = {**params, "job_id": job.id, "token": job.claim_token, "now": now}
        if conn is not None:
            return self._ack_and_record(conn, stmt, bound, event)
        with self.begin() as own:
            return self._ack_and_record(own, stmt, bound, event)

    def _ack_and_record(
        self, conn: Connection, stmt: Any, params: dict[str, Any], event: HistoryEvent
    ) -> bool:
        result = conn.execute(stmt, params)
        if result.returns_rows:
            # A settling acknowledgement returns whether the job has children.
            row = result.first()
            if row is None:
                return False
            self.record_events(conn, [event])
            if row[0]:
                self.release_children(conn, [event.job_id], now=params["now"], actor=event.actor)
            return True
        if result.rowcount != 1:
            return False
        self.record_events(conn, [event])
        return True

    def acknowledge_many(
        self, acks: Sequence[Ack], *, now: datetime, actor: str = "app"
    ) -> set[int]:
        """Write a batch of outcomes; return the ids whose claim still owned the row.

        Compare-and-set per row, as a single acknowledgement: a row is changed only if
        it is still ``running`` under the ack's claim token, so a worker whose lease
        lapsed changes nothing, and an id missing from the answer is a lost claim. The
        driver writes the batch with one commit (PostgreSQL: one statement over the
        whole batch on an autocommit connection; SQLite: one UPDATE over the batch's
        rows in one ``BEGIN IMMEDIATE`` transaction), and with it the history events of the
        rows still owned (``done``, ``failed``, ``retried``, ``snoozed``, by *actor*).
        """
        if not acks:
            return set()
        return self.driver.acknowledge_many(acks, now, actor)

    def count_due(self, *, now: datetime, queues: Collection[str] | None = None) -> int:
        """How many pending jobs are due at *now* (in *queues*), whatever holds them back.

        What a burst run reports it left: due jobs it could not claim (a paused queue or
        name, a concurrency key at its limit elsewhere). Reads the pending index.
        """
        t = self.table
        conditions = [self._is_pending(), t.c.waiting_for.is_(None), t.c.run_at <= now]
        if queues:
            conditions.append(t.c.queue.in_(list(queues)))
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).where(*conditions)).scalar_one())

    def wake_workers(self, queues: Collection[str]) -> None:
        """Wake the workers listening for *queues* now (where the database can: NOTIFY),
        outside any transaction: a freed concurrency slot is news to them at once."""
        if not self.driver.notifies or not queues:
            return
        with self.autocommit() as conn:
            for queue in sorted(queues):
                self.notify(conn, queue)
