"""The ``Defer`` extension: wiring into Flask and the one facade every caller uses.

Python code, the web blueprint and the CLI all call these methods, so a cancel from
the UI, from ``flask defer cancel`` and from a view is one code path with one set of
race rules. This module is the only place where Flask meets the store.

It is long because it is the whole public API in one class: every public method is
a thin, documented entry point; the work lives in the store, the executor, the worker
and the helper modules (``undo``, ``soft_delete``, ``batching``, ``http_jobs``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, overload

from flask import Flask, current_app, has_app_context
from sqlalchemy import Connection, Engine, MetaData, create_engine
from sqlalchemy.orm import Session, scoped_session

from . import batching, database, http_jobs, signals, undo_hooks
from . import soft_delete as _soft_delete
from .bulk import build_new_jobs
from .config import DeferConfig, apply_defaults, load_config
from .errors import InvalidArgument, JobNotFound, JobNotPending, NotConfigured, UnknownJob
from .execution import Executor, PendingAck, RetryPolicy, RunSummary
from .health import Health
from .jobs import Job, JobStatus
from .maintenance import prune as prune_settled
from .owner import OwnerLoader, resolve_owner
from .registry import Handler, HandlerSpec, Registry, validate_spec
from .schema import DEFAULT_TABLE_NAME, define_jobs_table
from .store import JobFilter, JobStore, NewJob
from .timeutil import Duration, as_duration, as_utc, resolve_run_at, utcnow
from .undo import MAX_JOB_ID, Toast, UndoOutcome
from .undo_hooks import UndoHook
from .validation import checked_limit, checked_payload, checked_text, identity, statuses
from .worker import Worker, WorkerOptions, make_worker

if TYPE_CHECKING:
    from .metrics import Metrics

F = TypeVar("F", bound=Handler)
#: The dashboard's authorisation hook: no arguments, True to let the request in.
DashboardAuth = Callable[[], Any]



@dataclass(frozen=True)
class DeferState:
    """What one app's ``app.extensions["defer"]`` holds."""

    extension: Defer
    config: DeferConfig
    store: JobStore
    executor: Executor
    #: The app's Flask-SQLAlchemy session, or None when Defer owns its engine.
    session: scoped_session[Session] | None
    #: The app's Prometheus metrics (``DEFER_METRICS``), or None.
    metrics: Metrics | None = None


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
    ) -> None:
        self.registry = Registry()
        # -- helpers: built-in jobs (purge, HTTP) and the undo hooks they use --
        self.undo_hooks = undo_hooks.UndoHooks()
        _soft_delete.register(self)
        http_jobs.register(self)
        # --
        self.db = db
        self.table_name = table_name
        # -- Undo UI --
        self._owner_loader: OwnerLoader | None = None
        # -- the operator dashboard --
        self._dashboard_auth: DashboardAuth | None = None
        if db is not None:
            # Defining the table now puts it in the metadata before create_all or
            # Alembic look, whatever order the app sets things up in.
            define_jobs_table(db.metadata, table_name)
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
        apply_defaults(app.config)
        config = load_config(app.config)
        if db is not None:
            if "sqlalchemy" not in app.extensions:
                raise NotConfigured(
                    "Flask-SQLAlchemy is not set up on this app yet: "
                    "call db.init_app(app) before defer.init_app(app, db=db)"
                )
            table = define_jobs_table(db.metadata, self.table_name)
            with app.app_context():
                engine: Engine = db.engine
            session: scoped_session[Session] | None = db.session
        else:
            uri = config.database_uri or database.default_sqlite_uri(app)
            engine = create_engine(uri)
            table = define_jobs_table(MetaData(), self.table_name)
            session = None
        if engine.dialect.name == "sqlite":
            database.tune_sqlite(engine, config)
        store = JobStore(engine, table)
        # A job due later than a worker's longest sleep needs no NOTIFY to be on time.
        store.notify_horizon = config.max_sleep
        if db is None:
            store.create_table()
        else:
            database.track_uncommitted(db.session)
            # helpers: hide soft-deleted rows from the app's ORM queries.
            _soft_delete.install_query_filter(db.session)
        executor = Executor(
            store,
            self.registry,
            policy=RetryPolicy(
                base=config.retry_base, cap=config.retry_cap, unknown_backoff=config.unknown_backoff
            ),
            context_factory=app.app_context,
            atomic_scope=lambda: self._atomic_scope(),
            sender=app,
        )
        # -- metrics: observe runs from the signals, per app (DEFER_METRICS) --
        metrics = None
        if config.metrics:
            from .metrics import Metrics

            metrics = Metrics(app, health=self._health_in_context(app))
        app.extensions["defer"] = DeferState(self, config, store, executor, session, metrics)
        # -- the worker: an embedded one for development ---------------------------
        if config.embedded_worker:
            from .embedded import EMBEDDED_SHUTDOWN_GRACE, install

            grace = min(config.shutdown_grace, EMBEDDED_SHUTDOWN_GRACE)
            install(
                app, lambda: make_worker(store, executor, config, shutdown_grace=grace)
            )

        from .cli import defer_cli

        app.cli.add_command(defer_cli)

        # -- Undo UI: blueprint, defer_toasts() and the htmx refresh trigger --
        from .web import init_web

        init_web(app, config)

    def _state(self) -> DeferState:
        if not has_app_context():
            raise NotConfigured(
                "flask_defer needs an application context: call it inside a request, "
                "a CLI command, or `with app.app_context():`"
            )
        state = current_app.extensions.get("defer")
        if state is None:
            raise NotConfigured(
                "flask_defer is not initialised on this app: did you forget defer.init_app(app)?"
            )
        assert isinstance(state, DeferState)
        return state

    @property
    def config(self) -> DeferConfig:
        """The current app's frozen flask_defer settings."""
        return self._state().config

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
        # Validate now, so a mistake points at the decorator line, not at first use.
        validate_spec(name if name is not None else "handler", max_attempts, timeout, queue)

        def register(func: F) -> F:
            job_name = name if name is not None else func.__name__
            self.registry.add(
                HandlerSpec(
                    name=job_name,
                    func=func,
                    max_attempts=max_attempts,
                    timeout=float(timeout) if timeout is not None else None,
                    atomic=atomic,
                    queue=queue,
                )
            )
            return func

        return register

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
    ) -> Job:
        """Schedule job *name* to run at ``run_at`` (aware) or after ``delay``; default now.

        The row is written in ``db.session``'s transaction: it becomes real when the
        caller commits and disappears if the caller rolls back, together with the
        business change it belongs to. ``key`` names the intent ("message:7:send"); only
        one live job may hold a key (:class:`JobExists`), unless ``replace=True`` swaps
        out the pending holder. ``owner`` and ``label`` are what the Undo UI shows.
        """
        state = self._state()
        spec = self.registry.get(name) if isinstance(name, str) else None
        if spec is None:
            if not isinstance(name, str):
                raise InvalidArgument("name", f"expected a job name string, got {name!r}")
            raise UnknownJob(name)
        now = utcnow()
        new = NewJob(
            name=name,
            payload=checked_payload(payload),
            run_at=resolve_run_at(run_at, delay, now),
            max_attempts=spec.max_attempts or state.config.max_attempts,
            queue=spec.queue,
            key=checked_text(key, "key"),
            owner=checked_text(owner, "owner"),
            label=checked_text(label, "label"),
            undo_until=as_utc(undo_until, "undo_until") if undo_until is not None else None,
        )
        if not isinstance(replace, bool):
            raise InvalidArgument("replace", f"expected True or False, got {replace!r}")
        with self._joined(state, writes=True) as conn:
            job = state.store.insert(conn, new, now=now, replace=replace)
        signals.job_scheduled.send(current_app._get_current_object(), job=job)  # type: ignore[attr-defined]
        return job

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
    ) -> Job:
        """Schedule *name* to run after an Undo window, and show its owner an Undo toast.

        The owner sees the toast for ``window`` (default ``DEFER_UNDO_WINDOW``, 5 s);
        the job runs ``DEFER_UNDO_MARGIN`` (1 s) after the window closes, so an Undo
        clicked in the last moment still lands. ``owner`` defaults to the current owner
        (see :meth:`owner_loader`); ``label`` is the toast's text ("Message sent").

        Like :meth:`schedule`, the row joins ``db.session``'s transaction: the caller
        commits it together with the business change (and the toast appears once it is
        committed).
        """
        state = self._state()
        span = (
            state.config.undo_window
            if window is None
            else as_duration(window, "window", allow_zero=False)
        )
        if owner is None:
            owner = self.current_owner(create=True)
            if owner is None:
                raise InvalidArgument(
                    "owner",
                    "there is no current owner to show the Undo toast to; call undoable() "
                    "while handling a request, or pass owner=",
                )
        now = utcnow()
        return self.schedule(
            name,
            payload,
            run_at=now + span + state.config.undo_margin,
            key=key,
            replace=replace,
            owner=owner,
            label=label,
            undo_until=now + span,
        )

    def undo(
        self, id: int | None = None, *, key: str | None = None, owner: str | None = None
    ) -> UndoOutcome:
        """The user's Undo: cancel a pending job, run its ``on_undo`` hooks, say what happened.

        pending → cancelled, :attr:`UndoOutcome.UNDONE` (``on_undo`` hooks run in the
        same transaction: a soft-deleted row is restored together with the cancel of
        its purge). running → ``RUNNING``; done or failed → ``ALREADY_RAN``;
        cancelled → ``ALREADY_UNDONE``. With ``owner`` (the web layer always passes
        it), a job of another owner raises :class:`JobNotFound`, as does no job at
        all: other people's ids are never confirmed to exist. Runs and commits a
        transaction of its own on ``db.session``, like :meth:`cancel`.
        """
        state = self._state()
        job_id, key = identity(id, key)
        checked_owner = checked_text(owner, "owner")
        if job_id is not None and not 1 <= job_id <= MAX_JOB_ID:
            raise JobNotFound(job_id)
        self._refuse_uncommitted(state, "undo")
        with self._atomic_scope() as conn:
            cancelled: Job | None = None
            # A failed attempt can put the job back to pending between the cancel and
            # the read below; cancelling again then is right, so try a few times.
            for _ in range(3):
                cancelled = state.store.cancel(
                    conn, now=utcnow(), job_id=job_id, key=key, owner=checked_owner
                )
                if cancelled is not None:
                    break
                existing = _refused(state, conn, job_id, key, checked_owner)
                if existing.status is not JobStatus.PENDING:
                    return UndoOutcome.for_status(existing.status)
            if cancelled is None:
                return UndoOutcome.RUNNING
            for hook in self.undo_hooks.for_name(cancelled.name):
                hook(cancelled)
        signals.job_cancelled.send(current_app._get_current_object(), job=cancelled)  # type: ignore[attr-defined]
        return UndoOutcome.UNDONE

    def toasts(
        self, owner: str | None = None, *, now: datetime | None = None, limit: int | None = None
    ) -> list[Toast]:
        """*owner*'s live Undo toasts (pending, window still open), newest first.

        ``owner`` defaults to the current owner; with none, there are no toasts.
        ``limit`` defaults to ``DEFER_TOAST_LIMIT``.
        """
        state = self._state()
        owner = checked_text(owner, "owner") if owner is not None else self.current_owner()
        if owner is None:
            return []
        at = as_utc(now, "now") if now is not None else utcnow()
        count = state.config.toast_limit if limit is None else checked_limit(limit)
        with self._joined(state) as conn:
            jobs = state.store.undoable_for(conn, owner, now=at, limit=count)
        return [Toast.from_job(job, at) for job in jobs]

    def pending_for(self, owner: str | None = None, *, limit: int = 100) -> list[Job]:
        """*owner*'s pending jobs, undoable or scheduled, soonest first.

        ``owner`` defaults to the current owner; with none, the list is empty.
        """
        state = self._state()
        owner = checked_text(owner, "owner") if owner is not None else self.current_owner()
        if owner is None:
            return []
        with self._joined(state) as conn:
            return state.store.pending_for(conn, owner, limit=checked_limit(limit))
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
        state = self._state()
        spec = self.registry.get(name) if isinstance(name, str) else None
        if spec is None:
            if not isinstance(name, str):
                raise InvalidArgument("name", f"expected a job name string, got {name!r}")
            raise UnknownJob(name)
        now = utcnow()
        jobs = build_new_jobs(
            payloads,
            name=name,
            queue=spec.queue,
            max_attempts=spec.max_attempts or state.config.max_attempts,
            now=now,
            run_at=run_at,
            delay=delay,
            owner=owner,
            label=label,
        )
        if not jobs:
            return 0
        with self._joined(state, writes=True) as conn:
            return state.store.insert_many(conn, jobs, now=now)

    # -- control ------------------------------------------------------------------

    def cancel(
        self, id: int | None = None, *, key: str | None = None, owner: str | None = None
    ) -> bool:
        """Cancel a pending job; True only if this call cancelled it.

        pending → cancelled, True. running, done, failed or cancelled → unchanged,
        False (a running job is in flight and cannot be stopped). Unknown id or key →
        :class:`JobNotFound`. ``owner`` restricts the cancel to that owner's job; a job
        of another owner counts as not found.
        """
        state = self._state()
        job_id, key = identity(id, key)
        self._refuse_uncommitted(state, "cancel")
        with state.store.begin() as conn:
            cancelled = state.store.cancel(conn, now=utcnow(), job_id=job_id, key=key, owner=owner)
            if cancelled is None:
                _refused(state, conn, job_id, key, owner)
                return False
        signals.job_cancelled.send(current_app._get_current_object(), job=cancelled)  # type: ignore[attr-defined]
        return True

    def cancel_many(
        self,
        *,
        key_prefix: str | None = None,
        name: str | None = None,
        owner: str | None = None,
        status: JobStatus | str | Iterable[JobStatus | str] | None = None,
    ) -> dict[str, int]:
        """Cancel every pending job matching the filters; report what was still running.

        Returns ``{"cancelled": n, "in_flight": m}``: *m* jobs matched but were already
        running, so they could not be stopped. At least one of ``key_prefix``, ``name``
        or ``owner`` is required; ``status`` narrows further (the dashboard passes its
        status filter, so a bulk cancel never reaches rows the operator did not see).
        """
        if key_prefix is None and name is None and owner is None:
            raise InvalidArgument(
                "key_prefix", "give key_prefix, name or owner; refusing to cancel every job"
            )
        where = JobFilter(
            statuses=statuses(status),
            key_prefix=checked_text(key_prefix, "key_prefix", allow_empty=False),
            name=checked_text(name, "name"),
            owner=checked_text(owner, "owner"),
        )
        state = self._state()
        self._refuse_uncommitted(state, "cancel_many")
        with state.store.begin() as conn:
            cancelled, in_flight = state.store.cancel_many(conn, where, now=utcnow())
        return {"cancelled": cancelled, "in_flight": in_flight}

    def reschedule(
        self,
        id: int | None = None,
        *,
        key: str | None = None,
        run_at: datetime | None = None,
        delay: Duration | None = None,
    ) -> Job:
        """Move a pending job to ``run_at`` or ``now + delay`` and return it.

        Only a waiting job moves: a running or settled one raises
        :class:`JobNotPending`; an unknown id or key raises :class:`JobNotFound`.
        """
        if run_at is None and delay is None:
            raise InvalidArgument("run_at", "give run_at or delay to reschedule to")
        state = self._state()
        job_id, key = identity(id, key)
        now = utcnow()
        when = resolve_run_at(run_at, delay, now)
        self._refuse_uncommitted(state, "reschedule")
        with state.store.begin() as conn:
            moved = state.store.reschedule(conn, when, now=now, job_id=job_id, key=key)
            if moved is None:
                existing = _refused(state, conn, job_id, key)
                raise JobNotPending(existing.id, existing.status.value)
        return moved

    def retry(self, id: int) -> Job:
        """Put a failed job back to pending, due now, with its attempts reset."""
        state = self._state()
        job_id, _ = identity(id, None)
        assert job_id is not None
        with state.store.begin() as conn:
            job = state.store.retry_failed(conn, job_id, now=utcnow())
            if job is None:
                existing = _refused(state, conn, job_id, None)
                raise JobNotPending(existing.id, existing.status.value)
        return job

    # -- reads --------------------------------------------------------------------

    def get(self, id: int | None = None, *, key: str | None = None) -> Job | None:
        """The job with this id; for a key, its live job, else the newest settled one."""
        state = self._state()
        job_id, key = identity(id, key)
        with self._joined(state) as conn:
            return state.store.get(conn, job_id=job_id, key=key)

    def list(
        self,
        *,
        status: JobStatus | str | Iterable[JobStatus | str] | None = None,
        name: str | None = None,
        key_prefix: str | None = None,
        owner: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Job]:
        """Jobs matching every given filter, newest first, at most *limit*."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise InvalidArgument("limit", f"expected an integer from 1 to 10000, got {limit!r}")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidArgument("offset", f"expected an integer ≥ 0, got {offset!r}")
        where = JobFilter(
            statuses=statuses(status),
            name=checked_text(name, "name"),
            key_prefix=checked_text(key_prefix, "key_prefix"),
            owner=checked_text(owner, "owner"),
        )
        state = self._state()
        with self._joined(state) as conn:
            return state.store.find(conn, where, limit=limit, offset=offset)

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

    def run_now(self, id: int) -> Job:
        """Make a pending job due now and return it (the dashboard's "Run now").

        One guarded statement, like :meth:`reschedule`: pending → due now. A running or
        settled job raises :class:`JobNotPending`; an unknown id :class:`JobNotFound`.
        """
        return self.reschedule(id, run_at=utcnow())

    def count(
        self,
        *,
        status: JobStatus | str | Iterable[JobStatus | str] | None = None,
        name: str | None = None,
        key_prefix: str | None = None,
        owner: str | None = None,
        limit: int | None = None,
    ) -> int:
        """How many jobs match every given filter (the filters of :meth:`list`).

        With ``limit``, counting stops there: the answer is ``min(count, limit)``, read
        from at most ``limit`` rows, so a page over a huge history stays cheap.
        """
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise InvalidArgument("limit", f"expected an integer ≥ 1 or None, got {limit!r}")
        where = self._job_filter(status, name, key_prefix, owner)
        state = self._state()
        with self._joined(state) as conn:
            return state.store.count(conn, where, limit=limit)

    def retry_many(
        self,
        *,
        status: JobStatus | str | Iterable[JobStatus | str] | None = None,
        name: str | None = None,
        key_prefix: str | None = None,
        owner: str | None = None,
    ) -> int:
        """Put every failed job matching the filters back to pending, due now; how many.

        Attempts are reset, as with :meth:`retry`. Jobs in any other state are left
        alone (one guarded statement), so a ``status`` filter without ``failed`` in it
        retries nothing. Without filters, every failed job is retried.
        """
        where = self._job_filter(status, name, key_prefix, owner)
        state = self._state()
        self._refuse_uncommitted(state, "retry_many")
        with state.store.begin() as conn:
            return state.store.retry_failed_many(conn, where, now=utcnow())

    @staticmethod
    def _job_filter(
        status: JobStatus | str | Iterable[JobStatus | str] | None,
        name: str | None,
        key_prefix: str | None,
        owner: str | None,
    ) -> JobFilter:
        return JobFilter(
            statuses=statuses(status),
            name=checked_text(name, "name"),
            key_prefix=checked_text(key_prefix, "key_prefix"),
            owner=checked_text(owner, "owner"),
        )

    def _health_in_context(self, app: Flask) -> Callable[[], Health]:
        """:meth:`health` of *app* from anywhere (a metrics scrape in a worker's thread)."""

        def health() -> Health:
            with app.app_context():
                return self.health()

        return health

    def health(self, now: datetime | None = None) -> Health:
        """Scheduled vs owed work, the oldest owed job's age, dead letters, lapsed leases."""
        state = self._state()
        at = as_utc(now, "now") if now is not None else utcnow()
        known = self.registry.names()
        with self._joined(state) as conn:
            # One pass over live and failed rows, bounded counts of settled ones.
            parts = state.store.counts_by_name(conn, now=at)
        return Health.from_counts(parts, known_names=known, now=at)

    # -- running ------------------------------------------------------------------

    def run_due(self, now: datetime | None = None, *, limit: int | None = None) -> RunSummary:
        """Claim and run every job due at *now* in this thread, then return a summary.

        For tests and cron: ``defer.run_due(now=datetime.now(UTC) + timedelta(hours=1))``
        runs what would be due in an hour. Retries are scheduled relative to *now*.
        The claim, execution and acknowledgement are the worker's own code.
        """
        state = self._state()
        fixed = as_utc(now, "now") if now is not None else None

        def clock() -> datetime:
            return fixed if fixed is not None else utcnow()

        self._refuse_uncommitted(state, "run_due")
        summary = RunSummary()
        started: set[int] = set()
        while limit is None or summary.ran < limit:
            batch = state.config.claim_batch
            if limit is not None:
                batch = min(batch, limit - summary.ran)
            jobs = state.store.claim(
                now=clock(),
                limit=batch,
                token=uuid.uuid4().hex,
                lease_until=clock() + state.config.lease,
            )
            # Each job runs at most once per call: a handler that reschedules itself
            # before the injected *now* (say, by wall-clock time) must not loop forever.
            again = [job for job in jobs if job.id in started]
            if again:
                state.store.release(again, now=clock(), keep_run_at=True)
            fresh = [job for job in jobs if job.id not in started]
            if not fresh:
                break
            # Outcomes are written per claimed batch, in one statement (see Executor.flush).
            pending = []
            try:
                for job in fresh:
                    started.add(job.id)
                    result = state.executor.execute(job, clock, batch=True)
                    if isinstance(result, PendingAck):
                        pending.append(result)
                    else:
                        summary.add(result)
            finally:
                for outcome in state.executor.flush(pending, clock):
                    summary.add(outcome)
        return summary

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
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            raise InvalidArgument("concurrency", f"expected an integer ≥ 1, got {concurrency!r}")
        names: list[str] | None = None
        if queues is not None:
            if isinstance(queues, str):
                raise InvalidArgument("queues", "expected a list of queue names, not one string")
            names = [checked_text(q, "queues") or "" for q in queues] or None
        return make_worker(
            state.store,
            state.executor,
            state.config,
            concurrency=concurrency,
            queues=names,
            burst=bool(burst),
            clock=clock,
        )

    def prune(self, now: datetime | None = None) -> int:
        """Delete settled jobs past their retention now; return how many.

        done and cancelled rows older than ``DEFER_RETENTION``, failed ones older than
        ``DEFER_FAILED_RETENTION``. Workers do this periodically by themselves.
        """
        state = self._state()
        at = as_utc(now, "now") if now is not None else utcnow()
        self._refuse_uncommitted(state, "prune")
        policy = WorkerOptions.from_config(state.config).maintenance
        return prune_settled(state.store, policy, lambda: at)

    # -- transactions -------------------------------------------------------------

    @contextmanager
    def _joined(self, state: DeferState, *, writes: bool = False) -> Iterator[Connection]:
        """The connection of the caller's transaction (db.session), or a short own one."""
        if state.session is None:
            with state.store.begin() as conn:
                yield conn
            return
        conn = state.session.connection(bind_arguments={"clause": state.store.table})
        if writes:
            state.session.info[database.UNCOMMITTED] = True
        yield conn

    @contextmanager
    def _atomic_scope(self) -> Iterator[Connection]:
        """A transaction on the handler's session, committed with the job's done mark."""
        state = self._state()
        if state.session is None:
            with state.store.begin() as conn:
                yield conn
            return
        session = state.session
        try:
            yield session.connection(bind_arguments={"clause": state.store.table})
        except BaseException:
            session.rollback()
            raise
        session.commit()

    @staticmethod
    def _refuse_uncommitted(state: DeferState, operation: str) -> None:
        # On SQLite the session's open write transaction would make this call wait for
        # the lock and then fail with "database is locked"; say what is wrong instead.
        if state.session is not None and state.session.info.get(database.UNCOMMITTED):
            raise NotConfigured(
                f"{operation}() runs in its own transaction, but db.session holds jobs "
                "scheduled and not committed yet: call db.session.commit() first"
            )

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
        return _soft_delete.soft_delete(self, obj, grace=grace, label=label, owner=owner)

    def restore(self, obj: Any) -> _soft_delete.RestoreOutcome:
        """Undo a :meth:`soft_delete` from code: cancel the purge and clear ``deleted_at``.

        Joins ``db.session`` (the caller commits). Returns ``RESTORED``, or ``PURGING``
        / ``PURGED`` when it is too late, or ``NOT_DELETED``.
        """
        return _soft_delete.restore(self, obj)

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
        """Add *item* to the batch job *name* of *key* (see :mod:`flask_defer.batching`).

        The handler of *name* receives every item of the batch, in order, in
        ``job.payload["items"]``. Joins ``db.session``: the item is added when the
        caller commits.
        """
        return batching.batch(
            self,
            name,
            key=key,
            item=item,
            window=window,
            max_items=max_items,
            mode=mode,
            max_wait=max_wait,
            now=now,
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
        """Schedule an HTTP request (see :mod:`flask_defer.http_jobs`); returns its job.

        2xx is done (status and a body excerpt in ``job.result``); 408, 429, 5xx and
        network errors are retried, honouring ``Retry-After``; other 4xx fail at once.
        """
        return http_jobs.schedule_http(
            self,
            url,
            method=method,
            json_body=json,
            headers=headers,
            run_at=run_at,
            delay=delay,
            key=key,
            timeout=timeout,
            replace=replace,
            owner=owner,
            label=label,
        )


def _refused(
    state: DeferState,
    conn: Connection,
    job_id: int | None,
    key: str | None,
    owner: str | None = None,
) -> Job:
    """The job a guarded change just left alone, read to say why.

    Read after the guarded statement lost, never before it: the write decides, the
    read only explains. No job at all, or (with *owner*) another owner's job, is
    :class:`JobNotFound`, so other people's ids are never confirmed to exist.
    """
    existing = state.store.get(conn, job_id=job_id, key=key)
    if existing is None or (owner is not None and existing.owner != owner):
        raise JobNotFound(job_id, key)
    return existing
