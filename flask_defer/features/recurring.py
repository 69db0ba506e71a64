"""Recurring schedules at run time: sync the declarations, write each tick's job once.

``defer.recurring(...)`` adds a :class:`~flask_defer.recurring_rules.RecurringSpec` to the
extension's :class:`Declarations` (at import, next to the handler). Each app gets one
:class:`Ticker` over its schedules table: the worker calls :meth:`Ticker.sync` when it
starts and :meth:`Ticker.materialise` in its loop; ``run_due`` does both. Tick jobs
are ordinary jobs (key ``recurring:<id>:<tick>``), so cancel, retries, health and the
dashboard treat them like any other.

No Flask here and no SQL: the SQL is in :mod:`flask_defer.store.recurring_statements`, the tick
arithmetic in :mod:`flask_defer.recurring_rules`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.exc import SQLAlchemyError

from ..errors import InvalidArgument, ScheduleNotFound
from ..jobs import Job
from ..recurring_rules import ON_TIME, RecurringSpec, plan, tick_key
from ..registry import Registry
from ..store.records import NewJob
from ..store.recurring_statements import ScheduleRow, ScheduleStore, SyncResult

logger = logging.getLogger("flask_defer.recurring")

#: Seconds a schedule whose tick could not be written is left alone before a retry.
BROKEN_RETRY = 60.0

#: Seconds between a running worker's records that its code still declares its
#: schedules (``declared_at``); ``run_due`` records it at every call.
DECLARED_REFRESH = 60.0

#: Health lists a schedule as undeclared once no code has declared it for this long
#: (or for the orphan grace period, if that is shorter): ten refreshes missed.
UNDECLARED_AFTER = timedelta(minutes=10)


class Declarations:
    """The ``defer.recurring(...)`` declarations of one extension, by id."""

    def __init__(self) -> None:
        self._specs: dict[str, RecurringSpec] = {}
        self._lock = threading.Lock()
        #: Bumped on every change, so a ticker knows its last sync is stale.
        self.version = 0

    def add(self, spec: RecurringSpec) -> None:
        """Declare *spec*; the same id declared again must say the same thing."""
        with self._lock:
            old = self._specs.get(spec.id)
            if old is not None and old != spec:
                raise InvalidArgument(
                    "id", f"recurring schedule {spec.id!r} is already declared differently"
                )
            if old is None:
                self._specs[spec.id] = spec
                self.version += 1

    def specs(self) -> list[RecurringSpec]:
        with self._lock:
            return list(self._specs.values())

    def __iter__(self) -> Iterator[RecurringSpec]:
        return iter(self.specs())

    def __len__(self) -> int:
        return len(self._specs)


@dataclass(frozen=True, slots=True)
class Late:
    """Schedules whose tick was not written on time (health counts them as backlog)."""

    count: int
    oldest_tick: datetime | None


class Ticker:
    """One app's recurring schedules: sync, materialise ticks, pause, resume, list."""

    def __init__(
        self,
        store: ScheduleStore,
        declarations: Declarations,
        registry: Registry,
        *,
        default_max_attempts: int,
        max_catch_up: int,
        orphan_grace: timedelta = timedelta(hours=24),
        on_written: Callable[[Job], None] | None = None,
    ) -> None:
        self.store = store
        self.declarations = declarations
        self.registry = registry
        self.default_max_attempts = default_max_attempts
        self.max_catch_up = max_catch_up
        #: How long a schedule no code declares keeps its row live before it is
        #: orphaned (``DEFER_SCHEDULE_ORPHAN_GRACE``).
        self.orphan_grace = orphan_grace
        #: Called with each job a tick (or "run now") wrote, after its commit: the
        #: state's ``job_scheduled`` signal, as for every other new job.
        self.on_written = on_written
        self._synced_version: int | None = None
        self._table_exists: bool | None = None
        #: Schedules whose tick could not be written, skipped until this monotonic time.
        self._broken: dict[str, float] = {}
        #: Monotonic time of the next refresh of ``declared_at`` (see materialise).
        self._refresh_at = 0.0
        #: Undeclared ids already logged by this process (logged once each).
        self._told_undeclared: set[str] = set()

    # -- sync ---------------------------------------------------------------------------

    def sync(self, now: datetime) -> SyncResult:
        """Copy this code's declarations into the table; leave the ids it does not declare.

        See :meth:`ScheduleStore.sync`: an id this code does not declare is ticked by
        the code that does, and orphaned only after ``DEFER_SCHEDULE_ORPHAN_GRACE``
        without any declaration.
        """
        version = self.declarations.version
        specs = self.declarations.specs()
        if not specs and not self._has_table():
            # An app without schedules on a database without the table: nothing to do.
            self._synced_version = version
            return SyncResult()
        result = self.store.sync(specs, now=now, orphan_grace=self.orphan_grace)
        self._synced_version = version
        self._refresh_at = time.monotonic() + DECLARED_REFRESH
        self._log_orphaned(result.orphaned)
        for schedule_id in result.undeclared:
            if schedule_id not in self._told_undeclared:
                self._told_undeclared.add(schedule_id)
                logger.info(
                    "recurring schedule %r is not declared by this code: left to the code "
                    "that declares it (orphaned after %s without a declaration, "
                    "DEFER_SCHEDULE_ORPHAN_GRACE)",
                    schedule_id,
                    self.orphan_grace,
                )
        return result

    def refresh(self, now: datetime) -> tuple[str, ...]:
        """Record that this code still declares its schedules; orphan the long-undeclared."""
        self._refresh_at = time.monotonic() + DECLARED_REFRESH
        orphaned = self.store.refresh(
            {spec.id for spec in self.declarations.specs()},
            now=now,
            orphan_grace=self.orphan_grace,
        )
        self._log_orphaned(orphaned)
        return orphaned

    def _log_orphaned(self, orphaned: tuple[str, ...]) -> None:
        for schedule_id in orphaned:
            logger.warning(
                "recurring schedule %r was not declared by any code for %s "
                "(DEFER_SCHEDULE_ORPHAN_GRACE): kept as orphaned, it stops ticking",
                schedule_id,
                self.orphan_grace,
            )

    def ensure_synced(self, now: datetime) -> None:
        """Sync once per process, and again after a new declaration."""
        if self._synced_version != self.declarations.version:
            self.sync(now)

    def _has_table(self) -> bool:
        # Looked up once per process: a database migrated meanwhile is seen after a restart.
        if self._table_exists is None:
            self._table_exists = self.store.table_exists()
        return self._table_exists

    @property
    def active(self) -> bool:
        """False for an app with no declarations and no schedules table: nothing to tick."""
        return len(self.declarations) > 0 or self._has_table()

    # -- ticks --------------------------------------------------------------------------

    def materialise(self, now: datetime) -> list[Job]:
        """Write the jobs of every tick due at *now*; return them.

        Only schedules this code declares: one it does not know (the other release's,
        during a rolling deploy) is ticked by the code that declares it. Each due
        schedule is advanced with the store's compare-and-set; a schedule that another
        worker advanced first is skipped (that worker wrote its ticks). Every
        :data:`DECLARED_REFRESH` seconds it first records that this code still declares
        its schedules (:meth:`refresh`).
        """
        if not self.active:
            return []
        if time.monotonic() >= self._refresh_at:
            self.refresh(now)
        declared = {spec.id for spec in self.declarations.specs()}
        written: list[Job] = []
        while True:
            due = self.store.due(now=now, ids=declared)
            progressed = False
            for row in due:
                if self._broken.get(row.id, 0.0) > time.monotonic():
                    continue
                try:
                    jobs = self._advance(row, now)
                except SQLAlchemyError:
                    raise  # the worker's loop backs off and retries
                except Exception:
                    # One broken schedule (a zone gone from the system's tz database, a
                    # payload the driver refuses) must not stop every other schedule.
                    logger.exception(
                        "recurring schedule %r: could not write its tick; trying again in %g s",
                        row.id,
                        BROKEN_RETRY,
                    )
                    self._broken[row.id] = time.monotonic() + BROKEN_RETRY
                    continue
                if jobs is not None:
                    progressed = True
                    written.extend(jobs)
                    for job in jobs:
                        self._written(job)
            if len(due) < 100 or not progressed:
                return written

    def _advance(self, row: ScheduleRow, now: datetime) -> list[Job] | None:
        steps = plan(row.rule, row.next_run_at, now, row.catch_up, self.max_catch_up)
        if steps.truncated:
            logger.warning(
                "recurring schedule %r missed more than %d ticks; only the newest %d run "
                "(DEFER_RECURRING_MAX_CATCH_UP)",
                row.id,
                self.max_catch_up,
                self.max_catch_up,
            )
        spec = self.registry.get(row.job_name)
        max_attempts = (spec.max_attempts if spec else None) or self.default_max_attempts
        queue = spec.queue if spec else "default"
        ticks = [
            (
                tick,
                NewJob(
                    name=row.job_name,
                    payload=row.payload if row.payload is not None else {},
                    run_at=tick,
                    max_attempts=max_attempts,
                    queue=queue,
                    key=tick_key(row.id, tick),
                    **(spec.rate_fields() if spec else {}),
                ),
            )
            for tick in steps.ticks
        ]
        return self.store.advance(row, next_tick=steps.next_tick, ticks=ticks, now=now)

    def next_due(self) -> datetime | None:
        """When the earliest live schedule this code declares ticks next (the wake-up)."""
        if not self.active:
            return None
        return self.store.next_due({spec.id for spec in self.declarations.specs()})

    def late(self, now: datetime) -> Late:
        """Live schedules whose tick is more than :data:`ON_TIME` overdue."""
        if not self.active:
            return Late(0, None)
        count, oldest = self.store.late(before=now - ON_TIME)
        return Late(count, oldest)

    def undeclared(self, now: datetime) -> tuple[str, ...]:
        """Ids of live schedules no running code has declared lately (health shows them).

        "Lately": within :data:`UNDECLARED_AFTER`, or the orphan grace period if that
        is shorter. A worker re-declares its schedules every minute and ``run_due`` at
        every call, so a schedule listed here is one no running code knows: removed
        from the code (it is orphaned when the grace period ends), or its release is
        not running anywhere. The ids this process declares are never listed: the
        code asking runs and declares them.
        """
        if not self.active:
            return ()
        within = min(UNDECLARED_AFTER, self.orphan_grace)
        mine = {spec.id for spec in self.declarations.specs()}
        found = self.store.undeclared(before=now - within, limit=50 + len(mine))
        return tuple(schedule_id for schedule_id in found if schedule_id not in mine)[:50]

    # -- run-time control ------------------------------------------------------------------

    def list(self, now: datetime) -> list[ScheduleRow]:
        """Every schedule in the table, orphaned ones included."""
        self.ensure_synced(now)
        return self.store.all() if self.active else []

    def get(self, schedule_id: str, now: datetime) -> ScheduleRow:
        """The schedule *schedule_id*, or :class:`ScheduleNotFound`."""
        self.ensure_synced(now)
        row = self.store.get(_checked_id(schedule_id)) if self.active else None
        if row is None:
            raise ScheduleNotFound(schedule_id)
        return row

    def pause(self, schedule_id: str, now: datetime) -> bool:
        """Stop ticking; True when this call paused it, False if it already was."""
        self.get(schedule_id, now)
        return self.store.pause(schedule_id, now=now)

    def resume(self, schedule_id: str, now: datetime) -> bool:
        """Tick again from the first tick at or after *now*; False if it was not paused."""
        row = self.get(schedule_id, now)
        spec = self.registry.get(row.job_name)
        return self.store.resume(
            schedule_id,
            next_tick=row.rule.first_at_or_after(now),
            now=now,
            queue=spec.queue if spec else "default",
        )

    def forget(self, schedule_id: str, now: datetime) -> bool:
        """Orphan a schedule gone from the code now; False if it already was orphaned.

        Refused for an id this code declares: the next sync would bring it back.
        """
        self.get(schedule_id, now)
        if schedule_id in {spec.id for spec in self.declarations.specs()}:
            raise InvalidArgument(
                "id",
                f"recurring schedule {schedule_id!r} is declared by this code; remove its "
                "defer.recurring(...) first, or pause it",
            )
        return self.store.forget(schedule_id, now=now)

    def run_now(self, schedule_id: str, now: datetime) -> Job:
        """Write one extra job of the schedule, due now; its ticks are unchanged."""
        row = self.get(schedule_id, now)
        spec = self.registry.get(row.job_name)
        new = NewJob(
            name=row.job_name,
            payload=row.payload if row.payload is not None else {},
            run_at=now,
            max_attempts=(spec.max_attempts if spec else None) or self.default_max_attempts,
            queue=spec.queue if spec else "default",
            key=f"{tick_key(row.id, now)}:now",
            **(spec.rate_fields() if spec else {}),
        )
        job = self.store.insert_job(new, now=now)
        self._written(job)
        return job

    def _written(self, job: Job) -> None:
        if self.on_written is not None:
            self.on_written(job)


def _checked_id(schedule_id: object) -> str:
    if not isinstance(schedule_id, str) or not schedule_id:
        raise InvalidArgument("id", f"expected a schedule id string, got {schedule_id!r}")
    return schedule_id

