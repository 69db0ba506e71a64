"""The ``Defer`` extension: wiring into Flask and the one facade every caller uses.

Python code, the web blueprint and the CLI all call these methods, so a cancel from
the UI, from ``flask defer cancel`` and from a view is one code path with one set of
race rules. Every public method is a thin, documented entry point: the per-app state
(:mod:`flask_defer.state`) holds the config, store, transactions and runner; the
control and read rules live in :mod:`flask_defer.operations`; the built-in helpers
in :mod:`flask_defer.helpers`.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, Unpack, overload

from flask import Flask, current_app

from . import operations, signals
from . import versioning_hooks as _versioning_hooks
from .config import DeferConfig
from .errors import InvalidArgument, JobNotFound, UnknownJob
from .execution import RunSummary
from .health import Health
from .helpers import batching, builtin_handlers, http_jobs
from .helpers import recurring as _recurring
from .helpers import soft_delete as _soft_delete
from .jobs import Job, JobEvent
from .operations import Filters
from .owner import OwnerLoader, resolve_owner
from .recurrence import CatchUp, RecurringSpec, make_rule, make_spec
from .registry import Handler, Registry
from .schema import (
    DEFAULT_SCHEDULES_TABLE_NAME,
    DEFAULT_TABLE_NAME,
    define_jobs_table,
    define_schedules_table,
)
from .state import DeferState, build_state, current_state
from .store import JobStore, versioning
from .store.schedules import ScheduleRow, ScheduleStore
from .timeutil import Duration, as_utc, utcnow
from .undo import Toast, UndoOutcome
from .undo_hooks import UndoHook, UndoHooks
from .validation import checked_actor, checked_payload, checked_text, identity
from .worker import Worker

if TYPE_CHECKING:
    from .metrics import Metrics

F = TypeVar("F", bound=Handler)
#: The dashboard's authorisation hook: no arguments, True to let the request in.
DashboardAuth = Callable[[], Any]


#: Revision ids, oldest first (``Defer.list`` shadows the builtin inside the class).
Revisions = list[str]


class Defer:
    """Durable, cancellable delayed jobs for a Flask app.

    Create it at module level and bind it later, like Flask-SQLAlchemy::

        db = SQLAlchemy(model_class=Base)
        defer = Defer()
        defer.init_app(app, db=db)   # after db.init_app(app)

    With a ``db``, the ``defer_jobs`` table lives in ``db.metadata`` and scheduling
    joins ``db.session``'s transaction. Without one, jobs live in their own SQLite file
    in the instance folder (or ``DEFER_DATABASE_URI``) and every call commits at once.
    """

    def __init__(
        self,
        app: Flask | None = None,
        db: Any = None,
        *,
        table_name: str = DEFAULT_TABLE_NAME,
        schedules_table_name: str = DEFAULT_SCHEDULES_TABLE_NAME,
    ) -> None:
        self.registry = Registry()
        #: ``defer.recurring(...)`` declarations (every app bound to this one ticks them).
        self.schedules = _recurring.Declarations()
        self.schedules_table_name = schedules_table_name
        self.undo_hooks = UndoHooks()
        # The built-in jobs (purge, HTTP) and the undo hook that restores a row.
        builtin_handlers(self.registry, self.undo_hooks)
        self.db = db
        self.table_name = table_name
        # -- Undo UI --
        self._owner_loader: OwnerLoader | None = None
        # -- the operator dashboard --
        self._dashboard_auth: DashboardAuth | None = None
        if db is not None:
            # Defining the table now puts it in the metadata before create_all or
            # Alembic look, whatever order the app sets things up in.
            table = define_jobs_table(db.metadata, table_name)
            # ... and db.create_all() records the revision, even in a process that
            # never calls init_app.
            versioning.record_on_create(table)
            define_schedules_table(db.metadata, schedules_table_name)
        if app is not None:
            self.init_app(app, db=db)

    # -- wiring -------------------------------------------------------------------

    def init_app(self, app: Flask, db: Any = None) -> None:
        """Bind to *app*: read config, find the engine, and register CLI and blueprint."""
        if "defer" in app.extensions:
            raise RuntimeError(
                "flask_defer is already registered on this app; call init_app once per app"
            )
        db = db if db is not None else self.db
        if db is not None and self.db is None:
            self.db = db
        state = build_state(
            app,
            registry=self.registry,
            undo_hooks=self.undo_hooks,
            db=db,
            table_name=self.table_name,
            extension=self,
            # helpers: hide soft-deleted rows from the app's ORM queries.
            on_session=(_soft_delete.install_query_filter,),
        )
        app.extensions["defer"] = state
        config = state.config
        if db is None and not config.database_uri:
            _versioning_hooks.warn_if_app_database_ignored(app)
        # -- migrations: one warning on the web side when the schema does not match --
        _versioning_hooks.warn_once_on_mismatch(app, state.store)
        # -- helpers: recurring schedules, ticked by this app's worker and run_due --
        object.__setattr__(state, "recurring", self._ticker_for(state))
        # -- the worker: an embedded one for development ---------------------------
        if config.embedded_worker:
            from .embedded import EMBEDDED_SHUTDOWN_GRACE, install

            grace = min(config.shutdown_grace, EMBEDDED_SHUTDOWN_GRACE)
            install(app, lambda: state.worker(shutdown_grace=grace))

        # cli and web sit above the facade; imported here only to register them.
        from .cli import defer_cli

        app.cli.add_command(defer_cli)

        # -- Undo UI: blueprint, defer_toasts() and the htmx refresh trigger --
        from .web import init_web

        init_web(app, config)

    @staticmethod
    def _state() -> DeferState:
        """The current app's state; :class:`NotConfigured` outside a set-up app."""
        return current_state()

    @property
    def config(self) -> DeferConfig:
        """The current app's frozen flask_defer settings."""
        return self._state().config

    @property
    def metrics(self) -> Metrics | None:
        """The current app's Prometheus metrics (``DEFER_METRICS``), or None."""
        return self._state().metrics

    def install(self) -> str:
        """Bring the jobs table to the newest revision, recorded; return the table's name.

        For apps without migrations (``flask defer install``): creates a fresh schema
        or upgrades an existing one. Raises :class:`ManagedByAlembic` in an app that
        runs its own Alembic (Flask-Migrate, or ``alembic_version`` in the database):
        there ``flask db upgrade`` does it. ``db.create_all()`` also records the revision.
        """
        state = self._state()
        store = state.store
        versioning.install(
            store.engine,
            store.table.name,
            app_migrations=_uses_flask_migrate(),
            schedules_table=self.schedules_table_name,
        )
        return store.table.name

    @property
    def store(self) -> JobStore:
        """The current app's store (for the worker, the CLI and tests)."""
        return self._state().store

    # -- handlers -----------------------------------------------------------------

    @overload
    def job(self, name: F, /) -> F: ...

    @overload
    def job(
        self,
        name: str | None = None,
        /,
        *,
        max_attempts: int | None = None,
        timeout: float | None = None,
        atomic: bool = False,
        queue: str = "default",
    ) -> Callable[[F], F]: ...

    def job(
        self,
        name: str | F | None = None,
        /,
        *,
        max_attempts: int | None = None,
        timeout: float | None = None,
        atomic: bool = False,
        queue: str = "default",
    ) -> F | Callable[[F], F]:
        """Register a handler for jobs called *name* (default: the function's name).

        ``max_attempts`` runs before the job is failed (default ``DEFER_MAX_ATTEMPTS``);
        ``timeout`` seconds a run may take in the worker; ``atomic=True`` commits the
        handler's ``db.session`` work in the same transaction as the ``done`` mark.
        """
        if callable(name):
            return self.job()(name)
        return self.registry.decorator(
            name, max_attempts=max_attempts, timeout=timeout, atomic=atomic, queue=queue
        )

    # -- scheduling ---------------------------------------------------------------

    def schedule(
        self,
        name: str,
        payload: Any = None,
        *,
        run_at: datetime | None = None,
        delay: Duration | None = None,
        key: str | None = None,
        replace: bool = False,
        owner: str | None = None,
        label: str | None = None,
        undo_until: datetime | None = None,
        actor: str | None = None,
    ) -> Job:
        """Schedule job *name* to run at ``run_at`` (aware) or after ``delay``; default now.

        The row is written in ``db.session``'s transaction: it becomes real when the
        caller commits and disappears if the caller rolls back, together with the
        business change it belongs to. ``key`` names the intent ("message:7:send"); only
        one live job may hold a key (:class:`JobExists`), unless ``replace=True`` swaps
        out the pending holder. ``owner`` and ``label`` are what the Undo UI shows.
        ``actor`` is who the job's history says scheduled it (default ``"app"``); every
        control method below takes it too.
        """
        return self._state().schedule(
            name, payload, run_at=run_at, delay=delay, key=key, replace=replace,
            owner=owner, label=label, undo_until=undo_until, actor=actor,
        )

    # -- Undo (the facade of the Undo UI) ---------------------------------------------

    def owner_loader(self, loader: OwnerLoader) -> OwnerLoader:
        """Register the function that names the current owner of Undo toasts (a decorator).

        It takes no arguments and returns a string id, or None when nobody is there.
        Without one, the owner is Flask-Login's authenticated user (``get_id()``) when
        the app uses Flask-Login, else an anonymous id kept in this browser's session.
        Toasts and Undo only ever see jobs whose ``owner`` equals this value.
        """
        if not callable(loader):
            raise InvalidArgument("loader", f"expected a function, got {loader!r}")
        self._owner_loader = loader
        return loader

    def current_owner(self, *, create: bool = False) -> str | None:
        """The current owner's id, or None (outside a request, or an anonymous visitor).

        ``create=True`` gives an anonymous visitor a per-browser id (stored in the
        session cookie); only scheduling an undoable job does that.
        """
        return resolve_owner(self._owner_loader, create=create)

    def on_undo(self, name: str) -> Callable[[UndoHook], UndoHook]:
        """Run the decorated ``hook(job)`` when a job called *name* is undone.

        The hook runs in the Undo's transaction, after the cancel and before the
        commit (with a ``db``, that is ``db.session``'s transaction): restoring a
        soft-deleted row and cancelling its purge commit together or not at all. If
        the hook raises, the Undo is rolled back and the error propagates.
        """
        if not isinstance(name, str) or not name:
            raise InvalidArgument("name", f"expected a job name string, got {name!r}")

        def register(hook: UndoHook) -> UndoHook:
            self.undo_hooks.add(name, hook)
            return hook

        return register

    def undoable(
        self,
        name: str,
        payload: Any = None,
        *,
        window: Duration | None = None,
        label: str | None = None,
        key: str | None = None,
        owner: str | None = None,
        replace: bool = False,
        done_label: str | None = None,
        failed_label: str | None = None,
        waiting_label: str | None = None,
        undone_label: str | None = None,
    ) -> Job:
        """Schedule *name* to run after an Undo window, and show its owner an Undo toast.

        The owner sees the toast for ``window`` (default ``DEFER_UNDO_WINDOW``, 5 s);
        the job runs ``DEFER_UNDO_MARGIN`` (1 s) after the window closes, so an Undo
        clicked in the last moment still lands. ``owner`` defaults to the current owner
        (see :meth:`owner_loader`); ``label`` is the toast's text ("Message sent").

        The toast only says what the server knows, in the texts given for each state:
        ``waiting_label`` once the window closed ("Sending…"), ``done_label`` when the
        job ran ("Sent"), ``failed_label`` when it failed for good ("Couldn't send"),
        ``undone_label`` after an Undo ("Sending undone."). Each has a neutral default.

        Like :meth:`schedule`, the row joins ``db.session``'s transaction: the caller
        commits it together with the business change (and the toast appears once it is
        committed).
        """
        state = self._state()
        owner = owner if owner is not None else self.current_owner(create=True)
        return operations.undoable(
            state,
            name,
            payload,
            window=window,
            label=label,
            key=key,
            owner=owner,
            replace=replace,
            texts={
                "waiting_label": waiting_label,
                "done_label": done_label,
                "failed_label": failed_label,
                "undone_label": undone_label,
            },
        )

    def hold(self, id: int, *, seconds: Duration, owner: str | None = None) -> Job:
        """Keep an open Undo window open *seconds* from now (its toast is hovered or focused).

        WCAG 2.2.1 (Timing Adjustable): the person reading the toast can stop its clock.
        One guarded update moves ``undo_until`` to now + *seconds* and ``run_at`` a
        ``DEFER_UNDO_MARGIN`` after it, only while the job is pending with its window
        open, only later, and never more than ``DEFER_UNDO_MAX_HOLD`` past the time it
        was first due (the request is cut to the cap). Returns the job as it now is
        (unchanged when it already runs later, or sits at the cap). A closed window or a
        job that is no longer pending raises :class:`JobNotPending`; no job, or with
        ``owner`` another owner's job, raises :class:`JobNotFound`.
        """
        return operations.hold(self._state(), id, seconds, owner)

    def undo(
        self,
        id: int | None = None,
        *,
        key: str | None = None,
        owner: str | None = None,
        commit: bool = True,
    ) -> UndoOutcome:
        """The user's Undo: cancel a pending job, run its ``on_undo`` hooks, say what happened.

        pending → cancelled, :attr:`UndoOutcome.UNDONE` (``on_undo`` hooks run in the
        same transaction: a soft-deleted row is restored together with the cancel of
        its purge). running → ``RUNNING``; done or failed → ``ALREADY_RAN``;
        cancelled → ``ALREADY_UNDONE``. With ``owner`` (the web layer always passes
        it), a job of another owner raises :class:`JobNotFound`, as does no job at
        all: other people's ids are never confirmed to exist. Runs and commits a
        transaction of its own on ``db.session``, like :meth:`cancel`.

        ``commit=False`` cancels and runs the hooks in the caller's ``db.session``
        transaction and commits nothing (see :meth:`cancel`): a rollback undoes the
        cancel and every hook's writes together. If a hook raises, the error
        propagates and the caller rolls back.
        The history records it as ``undone`` by the owner.
        """
        return operations.undo(self._state(), id, key, owner, commit=commit)

    def toasts(
        self,
        owner: str | None = None,
        *,
        now: datetime | None = None,
        limit: int | None = None,
        waiting: bool = False,
    ) -> list[Toast]:
        """*owner*'s live Undo toasts (pending, window still open), newest first.

        ``waiting=True`` adds the toasts whose window closed in the last
        :data:`~flask_defer.undo.WAITING_HORIZON` and whose job has not settled yet
        (what a page renders, so a reload during the wait keeps the toast waiting).
        ``owner`` defaults to the current owner; with none, there are no toasts.
        ``limit`` defaults to ``DEFER_TOAST_LIMIT``.
        """
        state = self._state()
        owner = checked_text(owner, "owner") if owner is not None else self.current_owner()
        if owner is None:
            return []
        return operations.toasts(state, owner, now=now, limit=limit, waiting=waiting)

    def pending_for(self, owner: str | None = None, *, limit: int = 100) -> list[Job]:
        """*owner*'s pending jobs, undoable or scheduled, soonest first.

        ``owner`` defaults to the current owner; with none, the list is empty.
        """
        state = self._state()
        owner = checked_text(owner, "owner") if owner is not None else self.current_owner()
        if owner is None:
            return []
        return operations.pending_for(state, owner, limit=limit)
    # -- bulk scheduling ----------------------------------------------------------

    def schedule_many(
        self,
        name: str,
        payloads: Iterable[Any],
        *,
        run_at: datetime | None = None,
        delay: Duration | None = None,
        owner: str | None = None,
        label: str | None = None,
    ) -> int:
        """Schedule many keyless jobs of handler *name* in one statement batch; return how many.

        Each item of *payloads* is a job's payload, or a :class:`~flask_defer.JobSpec`
        with its own ``run_at``/``delay``/``owner``/``label``; ``run_at``, ``delay``,
        ``owner`` and ``label`` given here apply to the items that do not set their own.
        Every item is validated with the rules of :meth:`schedule` before anything is
        written, so one bad item writes nothing. Like ``schedule()`` the rows join
        ``db.session``'s transaction and the caller commits.

        Bulk jobs have no key (use ``schedule()`` for keyed intents), and no
        ``job_scheduled`` signal is sent per job: there is no per-row ``Job`` to send.
        """
        return operations.schedule_many(
            self._state(), name, payloads, run_at=run_at, delay=delay, owner=owner, label=label
        )

    # -- control ------------------------------------------------------------------

    def cancel(
        self,
        id: int | None = None,
        *,
        key: str | None = None,
        owner: str | None = None,
        actor: str | None = None,
        commit: bool = True,
    ) -> bool:
        """Cancel a pending job; True only if this call cancelled it.

        pending → cancelled, True. running, done, failed or cancelled → unchanged,
        False (a running job is in flight and cannot be stopped). Unknown id or key →
        :class:`JobNotFound`. ``owner`` restricts the cancel to that owner's job; a job
        of another owner counts as not found.

        By default the cancel runs and commits a transaction of its own.
        ``commit=False`` runs the same guarded statement in ``db.session``'s current
        transaction and leaves the commit to the caller, so a business change and the
        cancel it implies commit together or not at all::

            offer.status = "accepted"
            defer.cancel(key=f"offer:{offer.id}:expire", commit=False)
            db.session.commit()

        The answer is decided when the call returns: True means "this transaction
        cancelled it". Until the caller commits, the job's row is locked (PostgreSQL;
        workers skip it) or the database's write lock is held (SQLite; workers wait
        for it); a rollback leaves the job exactly as it was, and a worker may then
        take it. ``job_cancelled`` is sent after the commit, never on a rollback.
        Needs a ``db`` (:class:`InvalidArgument` naming ``commit`` otherwise).
        """
        return operations.cancel(
            self._state(), id, key, owner, checked_actor(actor), commit=commit
        )

    def cancel_many(
        self,
        *,
        actor: str | None = None,
        commit: bool = True,
        **filters: Unpack[Filters],
    ) -> dict[str, int]:
        """Cancel every pending job matching the filters; report what was still running.

        Returns ``{"cancelled": n, "in_flight": m}``: *m* jobs matched but were already
        running, so they could not be stopped. At least one of ``key_prefix``, ``name``
        or ``owner`` is required; ``status`` narrows further (the dashboard passes its
        status filter, so a bulk cancel never reaches rows the operator did not see).
        ``commit=False`` joins the caller's transaction, as for :meth:`cancel`.
        """
        return operations.cancel_many(
            self._state(), filters, checked_actor(actor), commit=commit
        )

    def reschedule(
        self,
        id: int | None = None,
        *,
        key: str | None = None,
        run_at: datetime | None = None,
        delay: Duration | None = None,
        actor: str | None = None,
        commit: bool = True,
    ) -> Job:
        """Move a pending job to ``run_at`` or ``now + delay`` and return it.

        Only a waiting job moves: a running or settled one raises
        :class:`JobNotPending`; an unknown id or key raises :class:`JobNotFound`.
        ``commit=False`` joins the caller's transaction, as for :meth:`cancel`.
        """
        return operations.reschedule(
            self._state(), id, key, run_at, delay, checked_actor(actor), commit=commit
        )

    def retry(self, id: int, *, actor: str | None = None, commit: bool = True) -> Job:
        """Put a failed job back to pending, due now, with its attempts reset.

        ``commit=False`` joins the caller's transaction, as for :meth:`cancel`.
        """
        return operations.retry(self._state(), id, checked_actor(actor), commit=commit)

    def history(self, job_id: int) -> list[JobEvent]:
        """Every state change of job *job_id*, oldest first: what, when, who, which attempt.

        Written in the same transaction as each change, so it never disagrees with the
        row; pruned with its job. Empty for an unknown id or with ``DEFER_HISTORY = False``.
        """
        checked, _ = identity(job_id, None)
        assert checked is not None
        return self._state().history(checked)

    # -- reads --------------------------------------------------------------------

    def get(self, id: int | None = None, *, key: str | None = None) -> Job | None:
        """The job with this id; for a key, its live job, else the newest settled one."""
        try:
            job_id, key = identity(id, key)
        except JobNotFound:
            return None  # an id no row can have (≤ 0 or past 64 bits): unknown, like any
        return self._state().get(job_id, key)

    def list(
        self, *, limit: int = 100, offset: int = 0, **filters: Unpack[Filters]
    ) -> list[Job]:
        """Jobs matching every given filter, newest first, at most *limit*."""
        return operations.find(self._state(), filters, limit=limit, offset=offset)

    # -- the operator dashboard: access, run now, counts, bulk retry ----------------

    def dashboard_auth(self, hook: DashboardAuth) -> DashboardAuth:
        """Register who may use the dashboard (and the metrics endpoint); a decorator.

        The hook takes no arguments and runs inside the request; the dashboard answers
        403 unless it returns a true value. It may also raise an HTTP exception itself, say
        ``abort(401)`` or a redirect to the login page. Without a hook the dashboard
        is closed, except while ``app.debug`` is on::

            @defer.dashboard_auth
            def operators_only():
                return current_user.is_authenticated and current_user.is_admin
        """
        if not callable(hook):
            raise InvalidArgument("hook", f"expected a function, got {hook!r}")
        self._dashboard_auth = hook
        return hook

    def dashboard_allowed(self) -> bool:
        """True when the current request may use the dashboard (debug mode, or the hook)."""
        if current_app.debug:
            return True
        return self._dashboard_auth is not None and bool(self._dashboard_auth())

    def run_now(self, id: int, *, actor: str | None = None, commit: bool = True) -> Job:
        """Make a pending job due now and return it (the dashboard's "Run now").

        One guarded statement, like :meth:`reschedule`: pending → due now. A running or
        settled job raises :class:`JobNotPending`; an unknown id :class:`JobNotFound`.
        ``commit=False`` joins the caller's transaction, as for :meth:`cancel`.
        """
        return operations.reschedule(
            self._state(),
            id,
            None,
            utcnow(),
            None,
            checked_actor(actor),
            commit=commit,
            operation="run_now",
            event="run_now",
        )

    def count(self, *, limit: int | None = None, **filters: Unpack[Filters]) -> int:
        """How many jobs match every given filter (the filters of :meth:`list`).

        With ``limit``, counting stops there: the answer is ``min(count, limit)``, read
        from at most ``limit`` rows, so a page over a huge history stays cheap.
        """
        return operations.count(self._state(), filters, limit=limit)

    def retry_many(
        self, *, actor: str | None = None, **filters: Unpack[Filters]
    ) -> int:
        """Put every failed job matching the filters back to pending, due now; how many.

        Attempts are reset, as with :meth:`retry`. Jobs in any other state are left
        alone (one guarded statement), so a ``status`` filter without ``failed`` in it
        retries nothing. Without filters, every failed job is retried.
        """
        return operations.retry_many(self._state(), filters, checked_actor(actor))

    def health(self, now: datetime | None = None) -> Health:
        """Scheduled vs owed work, the oldest owed job's age, dead letters, lapsed leases."""
        return self._state().health(now)

    # -- running ------------------------------------------------------------------

    def run_due(
        self,
        now: datetime | None = None,
        *,
        limit: int | None = None,
        max_seconds: Duration | None = None,
    ) -> RunSummary:
        """Claim and run every job due at *now* in this thread, then return a summary.

        For tests and cron: ``defer.run_due(now=datetime.now(UTC) + timedelta(hours=1))``
        runs what would be due in an hour. Retries are scheduled relative to *now*.
        The claim, execution and acknowledgement are the worker's own code, and so are
        the two steps that make it a complete cron runner: before claiming it returns
        jobs with lapsed leases to pending (a run that was killed, with no worker
        anywhere to notice), and while it runs it renews the leases of the jobs it
        holds, so a worker beside it never starts one of them a second time.
        ``max_seconds`` stops claiming and starting jobs once that much time has
        passed (claimed jobs not started yet go back to pending): a cron run cannot
        overlap the next, except for the handler running at the limit.
        """
        return self._state().run_due(now, limit=limit, max_seconds=max_seconds)

    # -- the worker and retention -------------------------------------------------

    def worker(
        self,
        *,
        concurrency: int | None = None,
        queues: Iterable[str] | None = None,
        burst: bool = False,
        clock: Callable[[], datetime] | None = None,
    ) -> Worker:
        """A worker for the current app; call ``.run()`` on it (``flask defer worker``).

        ``concurrency`` handler threads (default ``DEFER_WORKER_CONCURRENCY``);
        ``queues`` limits it to jobs of those queues; ``burst`` makes ``run()`` return
        once nothing is due instead of waiting for more. ``clock`` replaces the wall
        clock (tests: run what is due at a chosen time with ``burst=True``).
        """
        state = self._state()
        # A worker on a schema behind or ahead of the code would fail on every claim.
        versioning.require_current(
            state.store.engine,
            state.store.table.name,
            app_migrations=_uses_flask_migrate(),
            schedules_table=self.schedules_table_name,
        )
        return operations.worker(
            state, concurrency=concurrency, queues=queues, burst=burst, clock=clock
        )

    # -- schema revisions (flask defer db ...) ---------------------------------------

    def schema_status(self) -> versioning.SchemaStatus:
        """How this app's database's flask_defer schema compares with the code's."""
        store = self._state().store
        return versioning.check(
            store.engine,
            store.table.name,
            app_migrations=_uses_flask_migrate(),
            schedules_table=self.schedules_table_name,
        )

    def upgrade_schema(self) -> Revisions:
        """Upgrade the schema to the newest revision; return the revisions applied."""
        store = self._state().store
        return versioning.upgrade(
            store.engine,
            store.table.name,
            app_migrations=_uses_flask_migrate(),
            schedules_table=self.schedules_table_name,
        )

    def schema_sql(self) -> str:
        """The SQL the upgrade would run, not executed (``flask defer db sql``)."""
        store = self._state().store
        return versioning.pending_sql(
            store.engine,
            store.table.name,
            app_migrations=_uses_flask_migrate(),
            schedules_table=self.schedules_table_name,
        )

    def prune(self, now: datetime | None = None) -> int:
        """Delete settled jobs past their retention now; return how many.

        done and cancelled rows older than ``DEFER_RETENTION``, failed ones older than
        ``DEFER_FAILED_RETENTION``. Workers do this periodically by themselves.
        """
        return self._state().prune(now)

    # -- helpers: recurring schedules ------------------------------------------------

    def _ticker_for(self, state: DeferState) -> _recurring.Ticker:
        """The recurring schedules of *state*'s app, over a table beside the jobs table."""
        # In the app's metadata, beside the jobs table, so db.create_all() and Alembic
        # autogenerate see it also when the db was passed to init_app only.
        metadata = state.db.metadata if state.db is not None else state.store.table.metadata
        table = define_schedules_table(metadata, self.schedules_table_name)
        ticker = _recurring.Ticker(
            ScheduleStore(state.store.engine, table, state.store),
            self.schedules,
            self.registry,
            default_max_attempts=state.config.max_attempts,
            max_catch_up=state.config.recurring_max_catch_up,
            on_written=lambda job: state.send(signals.job_scheduled, job=job),
        )
        if state.db is None and self._schema_at_head(state):
            # A jobs table created just now (by build_state) was recorded at the newest
            # revision, which includes this table. On an older recorded schema the table
            # comes from `flask defer db upgrade` (revision flask_defer_0002): creating it
            # here would make that revision fail on an existing table.
            ticker.store.create_table()
        return ticker

    def _schema_at_head(self, state: DeferState) -> bool:
        status = versioning.check(
            state.store.engine,
            state.store.table.name,
            schedules_table=self.schedules_table_name,
        )
        return status.ok

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
        the Unix epoch. Pass exactly one. ``catch_up`` says what happens to ticks missed
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

    def list_recurring(self) -> builtins.list[ScheduleRow]:
        """Every schedule with its next and last tick, paused and orphaned flags, by id.

        Orphaned schedules (declared once, no longer in code) are listed too: they are
        kept and never tick until declared again.
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
        assert state.recurring is not None
        return state.recurring

    # -- helpers: undo hooks, soft delete, batching, HTTP ----------------------------

    def soft_delete(
        self,
        obj: Any,
        grace: Duration = _soft_delete.DEFAULT_GRACE,
        *,
        label: str | None = None,
        owner: str | None = None,
    ) -> Job:
        """Hide *obj* now and hard-delete it after *grace*, unless it is restored.

        *obj* is a model instance using :class:`~flask_defer.SoftDeleteMixin`. Sets
        ``deleted_at`` and schedules the purge in ``db.session``'s transaction (the
        caller commits) and returns the purge job, undoable by its *owner* until
        ``grace - DEFER_UNDO_MARGIN`` from now. :meth:`undo` of that job, or
        :meth:`restore`, brings the row back.
        """
        if owner is None:
            owner = self.current_owner(create=True)
        return _soft_delete.soft_delete(self._state(), obj, grace=grace, label=label, owner=owner)

    def restore(self, obj: Any) -> _soft_delete.RestoreOutcome:
        """Undo a :meth:`soft_delete` from code: cancel the purge and clear ``deleted_at``.

        Joins ``db.session`` (the caller commits). Returns ``RESTORED``, or ``PURGING``
        / ``PURGED`` when it is too late, or ``NOT_DELETED``.
        """
        return _soft_delete.restore(self._state(), obj)

    def batch(
        self,
        name: str,
        *,
        key: str,
        item: Any,
        window: Duration = batching.DEFAULT_WINDOW,
        max_items: int | None = None,
        mode: batching.BatchMode = "window",
        max_wait: Duration | None = None,
        now: datetime | None = None,
    ) -> batching.Batched:
        """Add *item* to the batch job *name* of *key* (see :mod:`flask_defer.helpers.batching`).

        The handler of *name* receives every item of the batch, in order, in
        ``job.payload["items"]``. Joins ``db.session``: the item is added when the
        caller commits.
        """
        return batching.batch(
            self._state(), name, key=key, item=item, window=window, max_items=max_items,
            mode=mode, max_wait=max_wait, now=now,
        )

    def schedule_http(
        self,
        url: str,
        method: str = "POST",
        *,
        json: Any = None,
        headers: dict[str, str] | None = None,
        run_at: datetime | None = None,
        delay: Duration | None = None,
        key: str | None = None,
        timeout: Duration | None = None,
        replace: bool = False,
        owner: str | None = None,
        label: str | None = None,
    ) -> Job:
        """Schedule an HTTP request (see :mod:`flask_defer.helpers.http_jobs`); returns its job.

        2xx is done (status and a body excerpt in ``job.result``); 408, 429, 5xx and
        network errors are retried, honouring ``Retry-After``; other 4xx fail at once.
        """
        return http_jobs.schedule_http(
            self._state(), url, method=method, json_body=json, headers=headers, run_at=run_at,
            delay=delay, key=key, timeout=timeout, replace=replace, owner=owner, label=label,
        )


def _uses_flask_migrate() -> bool:
    """Whether the current app runs its own Alembic migrations (Flask-Migrate)."""
    return "migrate" in current_app.extensions


def current_defer() -> Defer:
    """The ``Defer`` bound to the current app: what the blueprint and the CLI call.

    Raises :class:`~flask_defer.NotConfigured` outside an app context or on an app
    that ``init_app`` was never called on.
    """
    extension = current_state().extension
    assert isinstance(extension, Defer)
    return extension
