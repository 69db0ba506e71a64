"""The schedules table's rows, and the sync of each process's declarations into them.

A process syncs only the ids its code declares (added, restarted on a changed rule,
copied) and records when it last declared them (``declared_at``); an id it does not
declare belongs to other code, the other release of a rolling deploy, and is left
alone until nobody has declared it for the orphan grace period. Every multi-row writer
here writes row by row in id order, so two processes syncing at once on PostgreSQL wait
for each other and never deadlock.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Table,
    and_,
    false,
    func,
    or_,
    select,
    true,
    update,
)

from ..recurring_rules import CatchUp, RecurringSpec, Rule

if TYPE_CHECKING:
    from . import JobStore


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """One row of the schedules table, as ``defer.list_recurring()`` returns it."""

    id: str
    job_name: str
    cron: str | None
    every: timedelta | None
    tz: str
    payload: Any
    catch_up: CatchUp
    paused: bool
    #: True once the schedule was forgotten (``defer.forget_recurring``) or no code
    #: declared it for ``DEFER_SCHEDULE_ORPHAN_GRACE``: kept, shown, and never ticks
    #: until a process whose code declares it starts.
    orphaned: bool
    next_run_at: datetime
    last_run_at: datetime | None
    #: When code declaring this id last synced it (None on a row written before
    #: revision flask_defer_0006 by code that did not record it).
    declared_at: datetime | None = None
    updated_at: datetime | None = None

    @property
    def declared_since(self) -> datetime | None:
        """When it was last known declared: ``declared_at``, else its last change."""
        return self.declared_at if self.declared_at is not None else self.updated_at

    @property
    def rule(self) -> Rule:
        """The stored rule (what the last sync copied from the declaration)."""
        return Rule(cron=self.cron, every=self.every, tz=self.tz)

    @classmethod
    def from_row(cls, row: Any) -> ScheduleRow:
        every = row["every_seconds"]
        return cls(
            id=row["id"],
            job_name=row["job_name"],
            cron=row["cron"],
            every=timedelta(seconds=every) if every is not None else None,
            tz=row["tz"],
            payload=row["payload"],
            catch_up=row["catch_up"],
            paused=bool(row["paused"]),
            orphaned=bool(row["orphaned"]),
            next_run_at=row["next_run_at"],
            last_run_at=row["last_run_at"],
            declared_at=row["declared_at"],
            updated_at=row["updated_at"],
        )


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What one sync did: ids added, whose rule changed, orphaned past the grace period,
    and the ids in the table this code does not declare (left to the code that does)."""

    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    orphaned: tuple[str, ...] = ()
    undeclared: tuple[str, ...] = ()


class ScheduleSync:
    """The sync half of :class:`~flask_defer.store.recurring_statements.ScheduleStore`."""

    engine: Engine
    table: Table
    jobs: JobStore

    # -- sync: each process's declarations are the truth for the ids it declares --------

    def sync(
        self, specs: Sequence[RecurringSpec], *, now: datetime, orphan_grace: timedelta
    ) -> SyncResult:
        """Make the table match *specs* for the ids they declare; leave every other id alone.

        A new id starts at its first tick at or after *now*. A changed rule (and an id
        declared again after being orphaned) restarts from *now* too, guarded on the old
        rule, so a second process syncing the same change from a stale read cannot move
        an advanced schedule back and run a tick twice. A changed job name, payload or
        catch-up policy is copied. Every declared row's ``declared_at`` becomes *now*.

        An id these specs do not declare is not touched: another process (the other
        release during a rolling deploy) may declare it and tick it. Only once no code
        has declared it for *orphan_grace* is it orphaned (listed in the result).
        """
        with self.jobs.begin_immediate() as conn:
            existing = self._read_all(conn)
            declared = {spec.id: spec for spec in specs}
            added: list[str] = []
            changed: list[str] = []
            undeclared: list[str] = []
            orphaned: list[str] = []
            # Row by row in id order, like every other multi-row writer here, so two
            # processes syncing at once on PostgreSQL wait for each other, never deadlock.
            for schedule_id in sorted(declared.keys() | existing.keys()):
                spec, old = declared.get(schedule_id), existing.get(schedule_id)
                if spec is not None:
                    outcome = self._sync_declared(conn, spec, old, now)
                    if outcome == "added":
                        added.append(schedule_id)
                    elif outcome == "changed":
                        changed.append(schedule_id)
                    continue
                assert old is not None
                if not old.orphaned:
                    undeclared.append(schedule_id)
                    if self._orphan_if_stale(conn, old, now - orphan_grace, now):
                        orphaned.append(schedule_id)
        return SyncResult(tuple(added), tuple(changed), tuple(orphaned), tuple(undeclared))

    def refresh(
        self, ids: Collection[str], *, now: datetime, orphan_grace: timedelta
    ) -> tuple[str, ...]:
        """Record that code declaring *ids* still runs; orphan ids no code declared lately.

        A running worker calls this now and then, so a schedule its code declares never
        looks undeclared however long the worker runs. Rules are not compared here
        (that is the sync's job, once per process): two releases declaring one id
        differently do not restart it back and forth. Returns the ids orphaned now.
        """
        orphaned: list[str] = []
        with self.jobs.begin_immediate() as conn:
            existing = self._read_all(conn)
            for schedule_id in sorted(existing):
                old = existing[schedule_id]
                if schedule_id in ids:
                    self._touch(conn, schedule_id, now)
                elif not old.orphaned and self._orphan_if_stale(
                    conn, old, now - orphan_grace, now
                ):
                    orphaned.append(schedule_id)
        return tuple(orphaned)

    def _read_all(self, conn: Connection) -> dict[str, ScheduleRow]:
        t = self.table
        return {
            row["id"]: ScheduleRow.from_row(row)
            for row in conn.execute(select(t)).mappings()
        }

    def _sync_declared(
        self, conn: Connection, spec: RecurringSpec, old: ScheduleRow | None, now: datetime
    ) -> str | None:
        """Write one declared spec: ``"added"``, ``"changed"`` (restarted) or None."""
        t = self.table
        values = _declared_values(spec)
        if old is None:
            stmt = (
                self.jobs.driver.insert_ignoring(t)
                .values(
                    id=spec.id,
                    **values,
                    paused=False,
                    orphaned=False,
                    next_run_at=spec.rule.first_at_or_after(now),
                    created_at=now,
                    updated_at=now,
                    declared_at=now,
                )
                .on_conflict_do_nothing(index_elements=[t.c.id])
                .returning(t.c.id)
            )
            return "added" if conn.execute(stmt).first() is not None else None
        declared_rule = (spec.rule.cron, spec.rule.every, spec.rule.tz)
        if (old.cron, old.every, old.tz) != declared_rule or old.orphaned:
            restarted = conn.execute(
                update(t)
                .where(t.c.id == spec.id, self._same_rule(old))
                .values(
                    **values,
                    orphaned=False,
                    next_run_at=spec.rule.first_at_or_after(now),
                    updated_at=now,
                    declared_at=now,
                )
            ).rowcount
            return "changed" if restarted else None
        if (old.job_name, old.payload, old.catch_up) != (
            spec.job_name,
            spec.payload,
            spec.catch_up,
        ):
            conn.execute(
                update(t)
                .where(t.c.id == spec.id)
                .values(
                    job_name=spec.job_name,
                    payload=spec.payload,
                    catch_up=spec.catch_up,
                    updated_at=now,
                    declared_at=now,
                )
            )
            return None
        self._touch(conn, spec.id, now)
        return None

    def _touch(self, conn: Connection, schedule_id: str, now: datetime) -> None:
        # Never backwards: run_due(now=<the past>) must not make a schedule look stale.
        t = self.table
        conn.execute(
            update(t)
            .where(t.c.id == schedule_id, or_(t.c.declared_at.is_(None), t.c.declared_at < now))
            .values(declared_at=now)
        )

    def _orphan_if_stale(
        self, conn: Connection, old: ScheduleRow, cutoff: datetime, now: datetime
    ) -> bool:
        """Orphan *old* if no code declared it since *cutoff* (guarded: a fresh
        declaration by another process between the read and this write wins)."""
        if old.declared_since is not None and old.declared_since >= cutoff:
            return False
        t = self.table
        return (
            conn.execute(
                update(t)
                .where(
                    t.c.id == old.id,
                    t.c.orphaned == false(),
                    func.coalesce(t.c.declared_at, t.c.updated_at) < cutoff,
                )
                .values(orphaned=True, updated_at=now)
            ).rowcount
            == 1
        )

    def forget(self, schedule_id: str, *, now: datetime) -> bool:
        """Orphan *schedule_id* now (it stops ticking); False if it already was."""
        t = self.table
        with self.jobs.begin_immediate() as conn:
            return (
                conn.execute(
                    update(t)
                    .where(t.c.id == schedule_id, t.c.orphaned == false())
                    .values(orphaned=True, updated_at=now)
                ).rowcount
                == 1
            )

    def undeclared(self, *, before: datetime, limit: int = 50) -> list[str]:
        """Ids of schedules not orphaned that no code has declared since *before*."""
        t = self.table
        stmt = (
            select(t.c.id)
            .where(
                t.c.orphaned == false(),
                func.coalesce(t.c.declared_at, t.c.updated_at) < before,
            )
            .order_by(t.c.id)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return list(conn.execute(stmt).scalars())

    def _same_rule(self, old: ScheduleRow) -> ColumnElement[bool]:
        t = self.table
        every = old.every.total_seconds() if old.every is not None else None
        return and_(
            t.c.cron.is_(None) if old.cron is None else t.c.cron == old.cron,
            t.c.every_seconds.is_(None) if every is None else t.c.every_seconds == every,
            t.c.tz == old.tz,
            t.c.orphaned == (true() if old.orphaned else false()),
        )


def _declared_values(spec: RecurringSpec) -> dict[str, Any]:
    every = spec.rule.every
    return {
        "job_name": spec.job_name,
        "cron": spec.rule.cron,
        "every_seconds": every.total_seconds() if every is not None else None,
        "tz": spec.rule.tz,
        "payload": spec.payload,
        "catch_up": spec.catch_up,
    }
