"""The ``Defer`` extension: wiring into Flask and the one facade every caller uses.

Python code, the web blueprint and the CLI all call these methods, so a cancel from
the UI, from ``flask defer cancel`` and from a view is one code path with one set of
race rules. This module is the only place where Flask meets the store.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, overload

from flask import Flask, current_app, has_app_context
from sqlalchemy import Connection, Engine, MetaData, create_engine, event
from sqlalchemy.orm import Session, scoped_session

from . import signals
from .bulk import build_new_jobs
from .config import DeferConfig, apply_defaults, load_config
from .errors import InvalidArgument, JobNotFound, JobNotPending, NotConfigured, UnknownJob
from .execution import Executor, RetryPolicy, RunSummary
from .health import Health
from .jobs import Job, JobStatus
from .registry import Handler, HandlerSpec, Registry, validate_spec
from .schema import DEFAULT_TABLE_NAME, define_jobs_table
from .store import JobFilter, JobStore, NewJob
from .timeutil import Duration, as_utc, resolve_run_at, utcnow

F = TypeVar("F", bound=Handler)

#: Marks a session whose transaction holds scheduled jobs not yet committed.
_UNCOMMITTED = "flask_defer.uncommitted"


@dataclass(frozen=True)
class DeferState:
    """What one app's ``app.extensions["defer"]`` holds."""

    extension: Defer
    config: DeferConfig
    store: JobStore
    executor: Executor
    #: The app's Flask-SQLAlchemy session, or None when Defer owns its engine.
    session: scoped_session[Session] | None


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
        self.db = db
        self.table_name = table_name
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
            uri = config.database_uri or _default_sqlite_uri(app)
            engine = create_engine(uri)
            table = define_jobs_table(MetaData(), self.table_name)
            session = None
        if engine.dialect.name == "sqlite":
            _tune_sqlite(engine, config)
        store = JobStore(engine, table)
        if db is None:
            store.create_table()
        else:
            _track_uncommitted(db.session)
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
        app.extensions["defer"] = DeferState(self, config, store, executor, session)

        from .cli import defer_cli

        app.cli.add_command(defer_cli)

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
            payload=_checked_payload(payload),
            run_at=resolve_run_at(run_at, delay, now),
            max_attempts=spec.max_attempts or state.config.max_attempts,
            queue=spec.queue,
            key=_checked_text(key, "key"),
            owner=_checked_text(owner, "owner"),
            label=_checked_text(label, "label"),
            undo_until=as_utc(undo_until, "undo_until") if undo_until is not None else None,
        )
        if not isinstance(replace, bool):
            raise InvalidArgument("replace", f"expected True or False, got {replace!r}")
        with self._joined(state, writes=True) as conn:
            job = state.store.insert(conn, new, now=now, replace=replace)
        signals.job_scheduled.send(current_app._get_current_object(), job=job)  # type: ignore[attr-defined]
        return job

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
            check_text=_checked_text,
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
        job_id, key = _identity(id, key)
        self._refuse_uncommitted(state, "cancel")
        with state.store.begin() as conn:
            cancelled = state.store.cancel(conn, now=utcnow(), job_id=job_id, key=key, owner=owner)
            if cancelled is None:
                existing = state.store.get(conn, job_id=job_id, key=key)
                if existing is None or (owner is not None and existing.owner != owner):
                    raise JobNotFound(job_id, key)
                return False
        signals.job_cancelled.send(current_app._get_current_object(), job=cancelled)  # type: ignore[attr-defined]
        return True

    def cancel_many(
        self,
        *,
        key_prefix: str | None = None,
        name: str | None = None,
        owner: str | None = None,
    ) -> dict[str, int]:
        """Cancel every pending job matching the filters; report what was still running.

        Returns ``{"cancelled": n, "in_flight": m}``: *m* jobs matched but were already
        running, so they could not be stopped. At least one filter is required.
        """
        if key_prefix is None and name is None and owner is None:
            raise InvalidArgument(
                "key_prefix", "give key_prefix, name or owner; refusing to cancel every job"
            )
        where = JobFilter(
            key_prefix=_checked_text(key_prefix, "key_prefix", allow_empty=False),
            name=_checked_text(name, "name"),
            owner=_checked_text(owner, "owner"),
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
        job_id, key = _identity(id, key)
        now = utcnow()
        when = resolve_run_at(run_at, delay, now)
        self._refuse_uncommitted(state, "reschedule")
        with state.store.begin() as conn:
            moved = state.store.reschedule(conn, when, now=now, job_id=job_id, key=key)
            if moved is None:
                existing = state.store.get(conn, job_id=job_id, key=key)
                if existing is None:
                    raise JobNotFound(job_id, key)
                raise JobNotPending(existing.id, existing.status.value)
        return moved

    def retry(self, id: int) -> Job:
        """Put a failed job back to pending, due now, with its attempts reset."""
        state = self._state()
        job_id, _ = _identity(id, None)
        assert job_id is not None
        with state.store.begin() as conn:
            job = state.store.retry_failed(conn, job_id, now=utcnow())
            if job is None:
                existing = state.store.get(conn, job_id=job_id)
                if existing is None:
                    raise JobNotFound(job_id)
                raise JobNotPending(existing.id, existing.status.value)
        return job

    # -- reads --------------------------------------------------------------------

    def get(self, id: int | None = None, *, key: str | None = None) -> Job | None:
        """The job with this id; for a key, its live job, else the newest settled one."""
        state = self._state()
        job_id, key = _identity(id, key)
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
            statuses=_statuses(status),
            name=_checked_text(name, "name"),
            key_prefix=_checked_text(key_prefix, "key_prefix"),
            owner=_checked_text(owner, "owner"),
        )
        state = self._state()
        with self._joined(state) as conn:
            return state.store.find(conn, where, limit=limit, offset=offset)

    def health(self, now: datetime | None = None) -> Health:
        """Scheduled vs owed work, the oldest owed job's age, dead letters, lapsed leases."""
        state = self._state()
        at = as_utc(now, "now") if now is not None else utcnow()
        with self._joined(state) as conn:
            counts = state.store.status_counts(conn, now=at)
            unknown = state.store.count_unknown(conn, self.registry.names())
        return Health.from_counts(counts, unknown_handlers=unknown, now=at)

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
            for job in fresh:
                started.add(job.id)
                summary.add(state.executor.execute(job, clock))
        return summary

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
            state.session.info[_UNCOMMITTED] = True
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
        if state.session is not None and state.session.info.get(_UNCOMMITTED):
            raise NotConfigured(
                f"{operation}() runs in its own transaction, but db.session holds jobs "
                "scheduled and not committed yet: call db.session.commit() first"
            )


def _default_sqlite_uri(app: Flask) -> str:
    import os

    os.makedirs(app.instance_path, exist_ok=True)
    return "sqlite:///" + os.path.join(app.instance_path, "defer.sqlite3")


def _tune_sqlite(engine: Engine, config: DeferConfig) -> None:
    """WAL lets the web read while the worker writes; the busy timeout makes writers wait."""
    busy_ms = int(config.sqlite_busy_timeout.total_seconds() * 1000)

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
            if engine.url.database not in (None, "", ":memory:"):
                cursor.execute("PRAGMA journal_mode = WAL")
        finally:
            cursor.close()

    event.listen(engine, "connect", on_connect)
    # Connections opened before init_app (if any) are replaced so all get the pragmas.
    engine.pool.dispose()


def _clear_uncommitted(session: Session, transaction: Any) -> None:
    # Commit, rollback and close all end the root transaction.
    if transaction.parent is None:
        session.info.pop(_UNCOMMITTED, None)


def _track_uncommitted(session: scoped_session[Session]) -> None:
    if not event.contains(session, "after_transaction_end", _clear_uncommitted):
        event.listen(session, "after_transaction_end", _clear_uncommitted)


def _identity(job_id: Any, key: Any) -> tuple[int | None, str | None]:
    """Validate the "id or key" pair that several facade methods take."""
    if (job_id is None) == (key is None):
        raise InvalidArgument("id", "give exactly one of id or key=")
    if job_id is not None and (isinstance(job_id, bool) or not isinstance(job_id, int)):
        raise InvalidArgument("id", f"expected an integer job id, got {job_id!r}")
    return job_id, _checked_text(key, "key")


def _checked_text(value: Any, argument: str, *, allow_empty: bool = False) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(argument, f"expected a string, got {type(value).__name__} {value!r}")
    if not value and not allow_empty:
        raise InvalidArgument(argument, "must not be empty")
    if len(value) > 255:
        raise InvalidArgument(argument, f"at most 255 characters, got {len(value)}")
    return value


def _checked_payload(payload: Any) -> Any:
    """Refuse what JSON cannot carry before anything is written; return the stored form."""
    if payload is None:
        return {}
    try:
        text = json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise InvalidArgument("payload", f"must be JSON-serialisable: {error}") from None
    # Round-trip so the caller's Job shows exactly what the handler will receive.
    return json.loads(text)


def _statuses(
    status: JobStatus | str | Iterable[JobStatus | str] | None,
) -> tuple[JobStatus, ...] | None:
    if status is None:
        return None
    items = [status] if isinstance(status, str) else list(status)
    try:
        return tuple(JobStatus(item) for item in items)
    except ValueError:
        allowed = ", ".join(s.value for s in JobStatus)
        raise InvalidArgument("status", f"expected one of {allowed}, got {status!r}") from None
