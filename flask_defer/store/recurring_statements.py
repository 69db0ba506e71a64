"""Every SQL statement of recurring schedules: sync, the tick compare-and-set, pause.

Exactly one job per tick, across any number of workers and hosts, comes from one
guarded statement: ``UPDATE ... SET next_run_at = :new WHERE id = :id AND
next_run_at = :old`` in the same transaction as the tick's job insert. Two workers
that read the same due schedule both try; the database lets exactly one of them
match the old tick, and the other writes nothing.

Deploy-safe like unknown handlers: a process only syncs and ticks the ids its code
declares, so during a rolling deploy the release that does not know a schedule leaves
its row alone and the release that declares it writes every tick. A schedule stops
(is orphaned) only when told to (:meth:`ScheduleStore.forget`) or after no code has
declared it for the grace period (``declared_at``, kept fresh by every sync and by a
running worker's :meth:`ScheduleStore.refresh`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Engine, Table, and_, false, func, select, true, update

from ..errors import JobExists
from ..jobs import Job
from .records import NewJob
from .recurring_sync import ScheduleRow, ScheduleSync, SyncResult
from .schema import typed_schedules_table

__all__ = ["ScheduleRow", "ScheduleStore", "SyncResult"]

if TYPE_CHECKING:
    from . import JobStore


class ScheduleStore(ScheduleSync):
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

    # -- ticks ------------------------------------------------------------------------

    def due(self, *, now: datetime, ids: Collection[str], limit: int = 100) -> list[ScheduleRow]:
        """Live schedules among *ids* whose next tick is at or before *now*, earliest first.

        *ids* are the schedules the caller's code declares: a process never ticks one
        it does not know (the other release of a rolling deploy ticks it).
        """
        if not ids:
            return []
        t = self.table
        stmt = (
            select(t)
            .where(self._active(), t.c.next_run_at <= now, t.c.id.in_(sorted(ids)))
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

    def next_due(self, ids: Collection[str]) -> datetime | None:
        """The earliest next tick of the live schedules among *ids* (the partial index)."""
        if not ids:
            return None
        t = self.table
        stmt = (
            select(t.c.next_run_at)
            .where(self._active(), t.c.id.in_(sorted(ids)))
            .order_by(t.c.next_run_at)
            .limit(1)
        )
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
