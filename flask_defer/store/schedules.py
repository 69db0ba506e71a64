"""Every SQL statement of recurring schedules: sync, the tick compare-and-set, pause.

Exactly one job per tick, across any number of workers and hosts, comes from one
guarded statement: ``UPDATE ... SET next_run_at = :new WHERE id = :id AND
next_run_at = :old`` in the same transaction as the tick's job insert. Two workers
that read the same due schedule both try; the database lets exactly one of them
match the old tick, and the other writes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ColumnElement,
    Engine,
    Table,
    and_,
    false,
    func,
    select,
    true,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from ..errors import JobExists
from ..jobs import Job
from ..recurrence import CatchUp, RecurringSpec, Rule
from ..schema import typed_schedules_table
from .records import NewJob

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
    #: True when no ``defer.recurring(...)`` declares this id any more: kept, shown,
    #: and never ticks until it is declared again.
    orphaned: bool
    next_run_at: datetime
    last_run_at: datetime | None

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
        )


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What one sync changed: ids added, whose rule changed, newly orphaned."""

    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    orphaned: tuple[str, ...] = ()


class ScheduleStore:
    """Reads and writes of the schedules table; tick jobs go through the job store."""

    def __init__(self, engine: Engine, table: Table, jobs: JobStore) -> None:
        self.engine = engine
        # The statements run on a copy with aware-UTC types (schema.typed_schedules_table).
        self.table = typed_schedules_table(table)
        self.jobs = jobs

    def create_table(self) -> None:
        """Create the schedules table if it does not exist (``flask defer install``)."""
        self.table.create(self.engine, checkfirst=True)

    def table_exists(self) -> bool:
        """True when the schedules table is in the database (an older schema lacks it)."""
        with self.engine.connect() as conn:
            return bool(self.engine.dialect.has_table(conn, self.table.name))

    # -- sync: the declarations in code are the source of truth ----------------------

    def sync(self, specs: Sequence[RecurringSpec], *, now: datetime) -> SyncResult:
        """Make the table match *specs*: add new ids, copy changed fields, orphan the rest.

        A new schedule (and one declared again after being orphaned) starts at its first
        tick at or after *now*. A changed rule restarts from *now* too, guarded on the
        old rule, so a second process syncing the same change cannot move an already
        advanced schedule back and run a tick twice.
        """
        # Long on purpose: one immediate transaction reads the table once and writes the
        # adds, guarded restarts and orphans against that read; split, each part would
        # need the connection and the read rows handed along.
        t = self.table
        added: list[str] = []
        changed: list[str] = []
        with self.jobs.begin_immediate() as conn:
            existing = {
                row.id: row
                for row in (ScheduleRow.from_row(r) for r in conn.execute(select(t)).mappings())
            }
            for spec in specs:
                values = _declared_values(spec)
                old = existing.get(spec.id)
                if old is None:
                    first = spec.rule.first_at_or_after(now)
                    stmt = (
                        self._dialect_insert()(t)
                        .values(
                            id=spec.id,
                            **values,
                            paused=False,
                            orphaned=False,
                            next_run_at=first,
                            created_at=now,
                            updated_at=now,
                        )
                        .on_conflict_do_nothing(index_elements=[t.c.id])
                        .returning(t.c.id)
                    )
                    if conn.execute(stmt).first() is not None:
                        added.append(spec.id)
                    continue
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
                        )
                    ).rowcount
                    if restarted:
                        changed.append(spec.id)
                    continue
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
                        )
                    )
            declared = {spec.id for spec in specs}
            gone = [i for i, row in existing.items() if i not in declared and not row.orphaned]
            if gone:
                conn.execute(
                    update(t)
                    .where(t.c.id.in_(gone), t.c.orphaned == false())
                    .values(orphaned=True, updated_at=now)
                )
        return SyncResult(tuple(added), tuple(changed), tuple(gone))

    # -- ticks ------------------------------------------------------------------------

    def due(self, *, now: datetime, limit: int = 100) -> list[ScheduleRow]:
        """Live schedules whose next tick is at or before *now*, earliest first."""
        t = self.table
        stmt = (
            select(t)
            .where(self._active(), t.c.next_run_at <= now)
            .order_by(t.c.next_run_at)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [ScheduleRow.from_row(r) for r in conn.execute(stmt).mappings()]

    def advance(
        self,
        row: ScheduleRow,
        *,
        next_tick: datetime,
        ticks: Sequence[tuple[datetime, NewJob]],
        now: datetime,
    ) -> list[Job] | None:
        """Move *row* from its read ``next_run_at`` to *next_tick* and write the ticks' jobs.

        One transaction: the guarded update (still at the tick we read, still live)
        and the inserts commit together or not at all. None when another process
        advanced (or paused) the schedule first: it wrote those ticks, so nothing is
        written here. A tick whose key a live job already holds is not written twice.
        """
        t = self.table
        last = ticks[-1][0] if ticks else None
        values: dict[str, Any] = {"next_run_at": next_tick, "updated_at": now}
        if last is not None:
            values["last_run_at"] = last
        written: list[Job] = []
        with self.jobs.begin_immediate() as conn:
            won = conn.execute(
                update(t)
                .where(t.c.id == row.id, t.c.next_run_at == row.next_run_at, self._active())
                .values(values)
            ).rowcount
            if won != 1:
                return None
            for _tick, new in ticks:
                try:
                    written.append(self.jobs.insert(conn, new, now=now, replace=False))
                except JobExists:
                    continue
        return written

    def next_due(self) -> datetime | None:
        """The earliest next tick of any live schedule (uses the partial index)."""
        t = self.table
        stmt = select(t.c.next_run_at).where(self._active()).order_by(t.c.next_run_at).limit(1)
        with self.engine.connect() as conn:
            value: datetime | None = conn.execute(stmt).scalar()
        return value

    def late(self, *, before: datetime) -> tuple[int, datetime | None]:
        """Live schedules whose next tick is older than *before*, and the oldest tick."""
        t = self.table
        stmt = select(func.count(), func.min(t.c.next_run_at)).where(
            self._active(), t.c.next_run_at < before
        )
        with self.engine.connect() as conn:
            count, oldest = conn.execute(stmt).one()
        return int(count), oldest

    # -- run-time control ----------------------------------------------------------------

    def get(self, schedule_id: str) -> ScheduleRow | None:
        """One schedule by id, or None."""
        t = self.table
        with self.engine.connect() as conn:
            row = conn.execute(select(t).where(t.c.id == schedule_id)).mappings().first()
        return ScheduleRow.from_row(row) if row is not None else None

    def all(self) -> list[ScheduleRow]:
        """Every schedule, orphaned ones included, by id."""
        t = self.table
        with self.engine.connect() as conn:
            return [
                ScheduleRow.from_row(r) for r in conn.execute(select(t).order_by(t.c.id)).mappings()
            ]

    def pause(self, schedule_id: str, *, now: datetime) -> bool:
        """running → paused and True; already paused → False (one guarded statement)."""
        t = self.table
        with self.jobs.begin_immediate() as conn:
            return (
                conn.execute(
                    update(t)
                    .where(t.c.id == schedule_id, t.c.paused == false())
                    .values(paused=True, updated_at=now)
                ).rowcount
                == 1
            )

    def resume(
        self, schedule_id: str, *, next_tick: datetime, now: datetime, queue: str
    ) -> bool:
        """paused → running from *next_tick* and True; not paused → False.

        The next tick is moved to the first one at or after the resume, so the ticks a
        pause skipped never come back as a burst. PostgreSQL workers of *queue* are
        notified, so they learn the new next tick now rather than at their next poll.
        """
        t = self.table
        with self.jobs.begin_immediate() as conn:
            resumed = (
                conn.execute(
                    update(t)
                    .where(t.c.id == schedule_id, t.c.paused == true())
                    .values(paused=False, next_run_at=next_tick, updated_at=now)
                ).rowcount
                == 1
            )
            if resumed:
                self.jobs.notify(conn, queue)
            return resumed

    def insert_job(self, new: NewJob, *, now: datetime) -> Job:
        """Write one job of a schedule outside its ticks (the dashboard's "Run now")."""
        with self.jobs.begin_immediate() as conn:
            return self.jobs.insert(conn, new, now=now, replace=False)

    # --

    def _active(self) -> ColumnElement[bool]:
        # The same expression as the partial index's WHERE, so the planner can use it.
        t = self.table
        return and_(t.c.paused == false(), t.c.orphaned == false())

    def _same_rule(self, old: ScheduleRow) -> ColumnElement[bool]:
        t = self.table
        every = old.every.total_seconds() if old.every is not None else None
        return and_(
            t.c.cron.is_(None) if old.cron is None else t.c.cron == old.cron,
            t.c.every_seconds.is_(None) if every is None else t.c.every_seconds == every,
            t.c.tz == old.tz,
            t.c.orphaned == (true() if old.orphaned else false()),
        )

    def _dialect_insert(self) -> Any:
        return postgresql.insert if self.engine.dialect.name == "postgresql" else sqlite.insert


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
