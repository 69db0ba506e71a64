"""``Defer``'s recurring-schedule methods: declare, list, pause, resume, run one now.

The ticker that writes each tick's job (exactly one per tick across workers) is
:mod:`flask_defer.features.recurring`; these methods declare schedules in code and
drive the current app's ticker.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from .. import signals
from ..config import DeferConfig
from ..errors import UnknownJob
from ..features import recurring as _recurring
from ..jobs import Job
from ..recurring_rules import CatchUp, RecurringSpec, make_rule, make_spec
from ..store import JobStore, versioning
from ..store.recurring_statements import ScheduleRow, ScheduleStore
from ..store.schema import SchemaNames, define_schedules_table
from ..timeutil import Duration, as_utc, utcnow
from ..validation import checked_payload
from .declarations import FacadeBase


class RecurringMethods(FacadeBase):
    """``defer.recurring(...)`` and the run-time controls of declared schedules."""

    def _ticker_for(
        self, store: JobStore, config: DeferConfig, db: Any, emit: Callable[..., None]
    ) -> _recurring.Ticker:
        """The recurring schedules of an app being set up, over a table beside its jobs
        table (``build_state`` calls this with the app's parts; *emit* sends signals)."""
        # In the app's metadata, beside the jobs table, so db.create_all() and Alembic
        # autogenerate see it also when the db was passed to init_app only.
        metadata = db.metadata if db is not None else store.table.metadata
        table = define_schedules_table(metadata, self.schedules_table_name)
        ticker = _recurring.Ticker(
            ScheduleStore(store.engine, table, store),
            self.schedules,
            self.registry,
            default_max_attempts=config.max_attempts,
            max_catch_up=config.recurring_max_catch_up,
            orphan_grace=config.schedule_orphan_grace,
            on_written=lambda job: emit(signals.job_scheduled, job=job),
        )
        names = SchemaNames(jobs=store.table.name, schedules=self.schedules_table_name)
        # At init_app, where Flask-Migrate may not be set up yet: as if it were not.
        if db is None and versioning.check(store.engine, names).ok:
            # A jobs table created just now (by build_state) was recorded at the newest
            # revision, which includes this table. On an older recorded schema the table
            # comes from `flask defer db upgrade` (revision flask_defer_0002): creating it
            # here would make that revision fail on an existing table.
            ticker.store.create_table()
        return ticker

    def recurring(
        self,
        id: str,
        job_name: str,
        cron: str | None = None,
        *,
        every: Duration | None = None,
        tz: str = "UTC",
        payload: Any = None,
        catch_up: CatchUp = "latest",
    ) -> RecurringSpec:
        """Declare the recurring schedule *id*: run *job_name* on a cron rule or interval.

        ``cron`` is a 5-field expression evaluated in the IANA zone ``tz`` (wall-clock
        intent across DST: a time skipped by spring-forward runs once at the next valid
        instant, a time repeated by fall-back runs once); ``every`` is a fixed interval
        (a timedelta or seconds, at least one second) ticking at whole multiples since
        the Unix epoch, the same in every zone (so ``tz`` must stay ``"UTC"`` with it).
        Pass exactly one. ``catch_up`` says what happens to ticks missed
        during downtime: ``"latest"`` runs the most recent one once, ``"skip"`` none,
        ``"all"`` every one (at most ``DEFER_RECURRING_MAX_CATCH_UP``).

        Declare it in code next to the handler, after ``@defer.job(job_name)``: an
        unregistered *job_name* raises :class:`UnknownJob` here, at the declaration. The
        declaration is the source of truth; the database (synced when a worker or
        ``run_due`` starts) keeps each schedule's next and last tick and paused flag.
        """
        rule = make_rule(cron, every, tz)
        spec = make_spec(id, job_name, rule, checked_payload(payload), catch_up)
        if spec.job_name not in self.registry:
            raise UnknownJob(spec.job_name)
        self.schedules.add(spec)
        return spec

    def list_recurring(self) -> list[ScheduleRow]:
        """Every schedule with its next and last tick, paused and orphaned flags, by id.

        Orphaned schedules (forgotten, or not declared by any code for
        ``DEFER_SCHEDULE_ORPHAN_GRACE``) are listed too: they are kept and never tick
        until declared again.
        """
        return self._ticker().list(utcnow())

    def pause_recurring(self, id: str) -> bool:
        """Stop the schedule *id* from ticking: True if this call paused it.

        Already paused → False. Unknown id → :class:`ScheduleNotFound`. Ticks already
        written stay ordinary pending jobs (cancel them like any job).
        """
        return self._ticker("pause_recurring").pause(id, utcnow())

    def resume_recurring(self, id: str, *, now: datetime | None = None) -> bool:
        """Let the paused schedule *id* tick again, from its next tick after *now*.

        Ticks that fell in the pause are not written (no burst). Not paused → False;
        unknown id → :class:`ScheduleNotFound`.
        """
        at = as_utc(now, "now") if now is not None else utcnow()
        return self._ticker("resume_recurring").resume(id, at)

    def forget_recurring(self, id: str) -> bool:
        """Stop the schedule *id*, gone from the code, now: True if this call orphaned it.

        Code that does not declare a schedule never stops it (during a rolling deploy
        the release that declares it keeps ticking it); it is orphaned by itself only
        after ``DEFER_SCHEDULE_ORPHAN_GRACE`` without a declaration. This does it now.
        The row is kept and listed; a process whose code declares the id again
        restarts it from its next tick when it starts. Already orphaned → False;
        unknown id → :class:`ScheduleNotFound`; an id this code declares →
        :class:`InvalidArgument` (remove the ``defer.recurring(...)`` first, or pause).
        """
        return self._ticker("forget_recurring").forget(id, utcnow())

    def run_recurring_now(self, id: str) -> Job:
        """Write one extra job of schedule *id*, due now (the dashboard's "Run now").

        The schedule's own ticks are unchanged; the job's key is
        ``recurring:<id>:<now>:now``.
        """
        return self._ticker("run_recurring_now").run_now(id, utcnow())

    def _ticker(self, writes: str | None = None) -> _recurring.Ticker:
        """The app's ticker; *writes* names a call that writes in its own transaction."""
        state = self._state()
        if writes is not None:
            state.transactions.refuse_uncommitted(writes)
        ticker = state.recurring
        assert isinstance(ticker, _recurring.Ticker)  # init_app sets the app's Ticker
        return ticker
