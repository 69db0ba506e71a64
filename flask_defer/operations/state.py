"""The per-app state in ``app.extensions["defer"]``, and the one insert-and-signal path.

``init_app`` builds one :class:`DeferState` per app with :func:`build_state`: the frozen
config, the store over the app's engine, the app's :class:`~flask_defer.store.transactions.
Transactions`, and the runner (claim → execute → acknowledge) that ``run_due`` and the
worker share. Everything that writes a new job goes through :meth:`DeferState.insert`,
and every signal is sent by :meth:`DeferState.send`, with the app as sender. The
helpers (soft delete, batching, HTTP jobs) are handed this object, never ``Defer``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from blinker import Signal
from flask import Flask, current_app, has_app_context
from sqlalchemy import Connection

from .. import signals
from ..config import DeferConfig, apply_defaults, load_config
from ..engine.execution import Clock, Executor, RunSummary
from ..engine.maintenance import expire_due, reclaim_lapsed
from ..engine.maintenance import prune as prune_settled
from ..engine.runner import Runner
from ..engine.ticks import RecurringTicks
from ..engine.worker import Worker, make_worker
from ..errors import InvalidArgument, JobNotFound, NotConfigured, UnknownJob
from ..jobs import Job, JobEvent
from ..registry import HandlerSpec, Registry, UndoHooks
from ..store import JobStore, NewJob, driver_class, versioning
from ..store.schema import SchemaNames, define_history_table, define_pauses_table
from ..store.transactions import Transactions
from ..timeutil import Duration, as_utc, resolve_run_at, utcnow
from ..validation import (
    checked_actor,
    checked_max_seconds,
    checked_payload_text,
    checked_state_texts,
    checked_text,
)
from .databases import engine_table_session
from .health import Health

if TYPE_CHECKING:
    from .metrics import Metrics


@dataclass(frozen=True, eq=False)
class DeferState:
    """What one app's ``app.extensions["defer"]`` holds (internal; use ``Defer``)."""

    #: The public facade bound to this app (the web layer and the CLI call it).
    extension: Any
    config: DeferConfig
    store: JobStore
    transactions: Transactions
    executor: Executor
    runner: Runner
    registry: Registry
    undo_hooks: UndoHooks
    #: The app, sender of every signal.
    app: Flask
    #: The app's Flask-SQLAlchemy ``db``, or None when flask_defer owns its engine.
    db: Any = None
    #: The app's Prometheus metrics (``DEFER_METRICS``), or None.
    metrics: Metrics | None = None
    #: The app's recurring schedules (:mod:`flask_defer.features.recurring`), set by
    #: ``init_app`` right after this state is built; the worker and run_due tick it.
    recurring: RecurringTicks | None = None

    # -- signals and inserts: the one path ------------------------------------------

    def send(self, signal: Signal, **kwargs: Any) -> None:
        """Send one of :mod:`flask_defer.signals` with this app as sender."""
        signal.send(self.app, **kwargs)

    def send_when_committed(self, signal: Signal, *, commit: bool, **kwargs: Any) -> None:
        """Send *signal* for a control call: now when it committed its own transaction,
        else once the caller's transaction commits (``commit=False``), never on rollback.

        A receiver must only hear of a cancel that became real: the same call rolled
        back leaves the job pending, as if it had never been made.
        """
        self.transactions.after_commit(lambda: self.send(signal, **kwargs), commit=commit)

    def spec_for(self, name: Any) -> HandlerSpec:
        """The registered handler of *name*; :class:`UnknownJob` if there is none."""
        if not isinstance(name, str):
            raise InvalidArgument("name", f"expected a job name string, got {name!r}")
        spec = self.registry.get(name)
        if spec is None:
            raise UnknownJob(name)
        return spec

    def max_attempts(self, spec: HandlerSpec) -> int:
        """Attempts of a job of *spec*: the handler's own, else ``DEFER_MAX_ATTEMPTS``."""
        return spec.max_attempts or self.config.max_attempts

    def insert(
        self,
        new: NewJob,
        *,
        now: datetime,
        replace: bool = False,
        conn: Connection | None = None,
        actor: str = "app",
    ) -> Job:
        """Write *new* (in *conn*, else joining the caller's transaction) and signal it.

        Raises :class:`~flask_defer.JobExists` when a live job holds the key and
        *replace* is False. *actor* is who the ``scheduled`` event names.
        """
        if conn is None:
            with self.transactions.joined(writes=True) as joined:
                job = self.store.insert(joined, new, now=now, replace=replace, actor=actor)
        else:
            job = self.store.insert(conn, new, now=now, replace=replace, actor=actor)
        self.send(signals.job_scheduled, job=job)
        return job

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
        texts: Mapping[str, str | None] | None = None,
        queue: str | None = None,
        priority: int | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        expires_at: datetime | None = None,
        ttl: Duration | None = None,
    ) -> Job:
        """Validate and insert one job (what ``Defer.schedule`` documents).

        *texts* are an Undo toast's state texts (``done_label=`` ...), from ``undoable``.
        """
        spec = self.spec_for(name)
        now = utcnow()
        when = resolve_run_at(run_at, delay, now, strict=self.config.strict_local_times)
        value, text = checked_payload_text(payload, max_bytes=self.config.max_payload_bytes)
        new = NewJob(
            name=name,
            payload=value,
            payload_json=text,
            run_at=when,
            max_attempts=self.max_attempts(spec),
            **spec.controls(
                run_at=when, queue=queue, priority=priority, ttl=ttl,
                concurrency_key=concurrency_key, concurrency_limit=concurrency_limit,
                expires_at=expires_at,
            ),  # fmt: skip
            key=checked_text(key, "key"),
            owner=checked_text(owner, "owner"),
            label=checked_text(label, "label"),
            undo_until=as_utc(undo_until, "undo_until") if undo_until is not None else None,
            **checked_state_texts(texts),
        )
        if not isinstance(replace, bool):
            raise InvalidArgument("replace", f"expected True or False, got {replace!r}")
        return self.insert(new, now=now, replace=replace, actor=checked_actor(actor))

    # -- reads ---------------------------------------------------------------------

    def get(self, job_id: int | None = None, key: str | None = None) -> Job | None:
        """The job with this id; for a key, its live job, else the newest settled one."""
        with self.transactions.joined() as conn:
            return self.store.get(conn, job_id=job_id, key=key)

    def history(self, job_id: int) -> list[JobEvent]:
        """Every recorded state change of *job_id*, oldest first ([] with history off)."""
        with self.transactions.joined() as conn:
            return self.store.history(conn, job_id)

    def refused(
        self, conn: Connection, job_id: int | None, key: str | None, owner: str | None = None
    ) -> Job:
        """The job a guarded change just left alone, read to say why.

        Read after the guarded statement lost, never before it: the write decides, the
        read only explains. No job at all, or (with *owner*) another owner's job, is
        :class:`JobNotFound`, so other people's ids are never confirmed to exist.
        """
        existing = self.store.get(conn, job_id=job_id, key=key)
        if existing is None or (owner is not None and existing.owner != owner):
            raise JobNotFound(job_id, key)
        return existing

    def health(self, now: datetime | None = None) -> Health:
        """Scheduled vs owed work, the oldest owed job's age, dead letters, lapsed leases."""
        at = as_utc(now, "now") if now is not None else utcnow()
        known = self.registry.names()
        with self.transactions.joined() as conn:
            # One pass over live and failed rows, bounded counts of settled ones.
            parts = self.store.counts_by_name(conn, now=at)
        late, oldest_late = 0, None
        undeclared: tuple[str, ...] = ()
        # Its own connection: on a schema without the table it answers [] (a failed
        # statement would have aborted the joined transaction on PostgreSQL).
        paused = tuple(pause.label for pause in self.store.paused())
        if self.recurring is not None:
            found = self.recurring.late(at)
            late, oldest_late = found.count, found.oldest_tick
            undeclared = self.recurring.undeclared(at)
        return Health.from_counts(
            parts,
            known_names=known,
            now=at,
            late_schedules=late,
            oldest_late_tick=oldest_late,
            undeclared_schedules=undeclared,
            paused=paused,
        )

    # -- running -------------------------------------------------------------------

    def run_due(
        self,
        now: datetime | None = None,
        *,
        limit: int | None = None,
        max_seconds: Duration | None = None,
        actor: str | None = None,
    ) -> RunSummary:
        """Run every job due at *now* in this thread, through the worker's runner.

        First the jobs of a run that died (``kill -9``, a lost host) whose leases lapsed
        go back to pending: the worker's reclaim step, under its lock, so a cron run
        needs no worker anywhere. Leases are judged by the wall clock, not by *now*:
        ``run_due(now=tomorrow)`` never takes over a job that is running right now.
        """
        fixed = as_utc(now, "now") if now is not None else None
        deadline = None
        if max_seconds is not None:
            deadline = time.monotonic() + checked_max_seconds(max_seconds).total_seconds()

        def clock() -> datetime:
            return fixed if fixed is not None else utcnow()

        runner = self.runner
        if actor is not None:
            # The same executor and settings; only the name the history records differs.
            runner = Runner(
                self.store,
                runner.executor,
                lease=runner.lease,
                claim_batch=runner.claim_batch,
                actor=checked_actor(actor),
            )
        self.transactions.refuse_uncommitted("run_due")
        reclaim_lapsed(self.store, utcnow, actor=runner.actor)
        expire_due(self.store, clock, actor=runner.actor)
        if self.recurring is not None:
            # Sync at every call (run_due is a cron runner's whole "worker start"), then
            # write the ticks due by *now*, so the runner below runs them too.
            self.recurring.sync(clock())
            self.recurring.materialise(clock())
        return runner.run_due(clock, limit=limit, deadline=deadline)

    def worker(self, *, clock: Clock | None = None, **options: Any) -> Worker:
        """A worker over this app's store and executor (options as ``make_worker``)."""
        return make_worker(
            self.store, self.executor, self.config, clock=clock, ticker=self.recurring, **options
        )

    def prune(self, now: datetime | None = None) -> int:
        """Delete settled jobs past their retention now; return how many."""
        at = as_utc(now, "now") if now is not None else utcnow()
        self.transactions.refuse_uncommitted("prune")
        return prune_settled(self.store, self.config.maintenance_policy(), lambda: at)


def build_state(
    app: Flask,
    *,
    registry: Registry,
    undo_hooks: UndoHooks | None = None,
    db: Any = None,
    table_name: str = "defer_jobs",
    extension: Any = None,
    on_session: Collection[Callable[[Any], None]] = (),
) -> DeferState:
    """Read *app*'s config, find its engine and build its state (not yet registered).

    With *db* (Flask-SQLAlchemy, already bound to *app*) the table joins
    ``db.metadata`` and the transactions join ``db.session``; each of *on_session*
    is then called with the session (a helper installing its query filter). Without
    one, jobs live in ``DEFER_DATABASE_URI`` or a SQLite file in the instance folder,
    and the table is created at once.
    """
    # Long on purpose: the one place an app's parts are built, in the order each needs
    # the last (engine, store, transactions, executor, runner, state); split, that order
    # would be spread over functions that each take most of the others.
    apply_defaults(app.config)
    config = load_config(app.config)
    engine, table, session = engine_table_session(app, config, db, table_name)
    # The driver tunes the engine once, before any connection is used (SQLite: WAL, the
    # busy timeout, writers taking turns).
    driver_class(engine.dialect).prepare_engine(engine, config.sqlite_busy_timeout)
    # The history table joins the jobs table's metadata (db.create_all, autogenerate).
    history = define_history_table(table.metadata, table.name) if config.history else None
    # So is the pauses table, always (the claim reads it).
    store = JobStore(engine, table, history, define_pauses_table(table.metadata, table.name))
    # A job due later than a worker's longest sleep needs no NOTIFY to be on time.
    store.notify_horizon = config.max_sleep
    if session is None:
        store.create_table(history=False)
        if versioning.check(engine, SchemaNames(jobs=table.name)).ok:
            # A jobs table created just now was recorded at the newest revision, which
            # includes the history and pauses tables. On an older recorded schema they
            # come from `flask defer db upgrade` (revisions flask_defer_0003 and 0007):
            # creating them here would make those revisions fail on an existing table.
            store.create_table()
    transactions = Transactions(store, session)
    for hook in on_session if session is not None else ():
        hook(session)

    def emit(signal: Signal, **kwargs: Any) -> None:
        state.send(signal, **kwargs)  # the executor's signals go the one way too

    executor = Executor(
        store,
        registry,
        policy=config.retry_policy(),
        context_factory=app.app_context,
        atomic_scope=lambda: transactions.atomic(handler=True),
        emit=emit,
        uncommitted=transactions.holds_uncommitted if session is not None else None,
        sqlite_busy_timeout=config.sqlite_busy_timeout,
    )
    runner = Runner(store, executor, lease=config.lease, claim_batch=config.claim_batch)
    state = DeferState(
        extension=extension,
        config=config,
        store=store,
        transactions=transactions,
        executor=executor,
        runner=runner,
        registry=registry,
        undo_hooks=undo_hooks if undo_hooks is not None else UndoHooks(),
        app=app,
        db=db,
    )
    if config.metrics:
        from .metrics import Metrics

        def health() -> Health:
            # A scrape can come from any thread (a worker's metrics server).
            with app.app_context():
                return state.health()

        object.__setattr__(state, "metrics", Metrics(app, health=health))
    return state


def state_of(app: Flask) -> DeferState | None:
    """*app*'s flask_defer state, or None when ``init_app`` was not called on it."""
    state = app.extensions.get("defer")
    return state if isinstance(state, DeferState) else None


def current_state() -> DeferState:
    """The current app's state; :class:`NotConfigured` that says what to do otherwise."""
    if not has_app_context():
        raise NotConfigured(
            "flask_defer needs an application context: call it inside a request, "
            "a CLI command, or `with app.app_context():`"
        )
    state = state_of(current_app)
    if state is None:
        raise NotConfigured(
            "flask_defer is not initialised on this app: did you forget defer.init_app(app)?"
        )
    return state

