"""``Defer``'s core methods: handlers, scheduling, control, reads and running.

The rules live below (:mod:`flask_defer.operations`); each method
here checks what only the public signature knows and hands the current app's state on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, Unpack, overload

from ..config import DeferConfig
from ..engine.execution import RunSummary
from ..engine.worker import Worker
from ..errors import JobNotFound
from ..jobs import Job, JobEvent
from ..operations import control, reads, running, scheduling
from ..operations.health import Health
from ..operations.reads import Filters
from ..operations.scheduling import ScheduleOptions
from ..registry import Handler
from ..store import JobStore
from ..timeutil import Duration
from ..validation import checked_actor, identity
from .declarations import FacadeBase

if TYPE_CHECKING:
    from ..operations.metrics import Metrics

F = TypeVar("F", bound=Handler)


class CoreMethods(FacadeBase):
    """Register handlers; schedule, control, read and run jobs of the current app."""

    @property
    def config(self) -> DeferConfig:
        """The current app's frozen flask_defer settings."""
        return self._state().config

    @property
    def metrics(self) -> Metrics | None:
        """The current app's Prometheus metrics (``DEFER_METRICS``), or None."""
        return self._state().metrics

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
        priority: int = 0,
        concurrency_limit: int | None = None,
        ttl: Duration | None = None,
        rate_limit: str | None = None,
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
        priority: int = 0,
        concurrency_limit: int | None = None,
        ttl: Duration | None = None,
        rate_limit: str | None = None,
    ) -> F | Callable[[F], F]:
        """Register a handler for jobs called *name* (default: the function's name).

        ``max_attempts`` runs before the job is failed (default ``DEFER_MAX_ATTEMPTS``);
        ``timeout`` seconds a run may take in the worker; ``atomic=True`` commits the
        handler's ``db.session`` work in the same transaction as the ``done`` mark.
        ``queue``, ``priority`` (-100 to 100, lower first), ``concurrency_limit`` (for
        jobs scheduled with a ``concurrency_key``) and ``ttl`` are the defaults of this
        handler's jobs; ``schedule()`` may override each (see docs/queues.md).
        ``rate_limit`` (``"10/s"``, ``"100/m"``, ``"1000/h"``): at most that many of its
        jobs start per period across every worker and process, per ``rate_key`` given to
        ``schedule()`` (one bucket per tenant, per provider); jobs over the limit stay
        pending and the workers wake when the bucket frees (see docs/workflows.md).
        """
        if callable(name):
            return self.job()(name)
        return self.registry.decorator(
            name, max_attempts=max_attempts, timeout=timeout, atomic=atomic, queue=queue,
            priority=priority, concurrency_limit=concurrency_limit, ttl=ttl,
            rate_limit=rate_limit,
        )  # fmt: skip

    # -- scheduling ---------------------------------------------------------------

    def schedule(
        self,
        name: str,
        payload: Any = None,
        *,
        undo_until: datetime | None = None,
        **options: Unpack[ScheduleOptions],
    ) -> Job:
        """Schedule job *name* to run at ``run_at`` (aware) or after ``delay``; default now.

        The options (:class:`~flask_defer.operations.scheduling.ScheduleOptions`) are
        ``run_at``, ``delay``, ``key``, ``replace``, ``owner``, ``label``, ``actor`` and
        the queue controls. The row is written in ``db.session``'s transaction: it
        becomes real when the caller commits and disappears if the caller rolls back,
        together with the business change it belongs to. ``key`` names the intent
        ("message:7:send"); only one live job may hold a key (:class:`JobExists`),
        unless ``replace=True`` swaps out the pending holder. ``owner`` and ``label``
        are what the Undo UI shows. ``actor`` is who the job's history says scheduled it
        (default ``"app"``); every control method below takes it too. ``undo_until``
        gives the job an Undo window of its own (:meth:`undoable` sets it for you).

        Queue controls (each defaults to the handler's ``@defer.job(...)`` setting):
        ``queue`` names the queue (``flask defer worker --queue``, ``defer.pause``);
        ``priority`` from -100 to 100, lower claimed first (default 0);
        ``concurrency_key`` with ``concurrency_limit`` (default 1): at most that many
        jobs of the key run at once; ``expires_at`` (aware) or ``ttl`` (after
        ``run_at``): a job not started by then settles as ``expired``.
        """
        return scheduling.schedule(
            self._state(), name, payload, undo_until=undo_until, **options
        )

    # -- bulk scheduling ----------------------------------------------------------

    def schedule_many(
        self, name: str, payloads: Iterable[Any], **options: Unpack[ScheduleOptions]
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
        ``queue``, ``priority`` and ``ttl`` (from each job's ``run_at``) apply to every
        job, as in :meth:`schedule`; ``actor`` names who scheduled them; the options of
        keyed jobs (``key``, ``replace``, a concurrency key) and ``expires_at`` are
        refused with :class:`InvalidArgument` naming the option.
        """
        return scheduling.schedule_many(self._state(), name, payloads, **options)

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

        ``actor`` says who cancels, for the history. With one (an operator: the
        dashboard passes the signed-in operator, ``flask defer cancel`` passes
        ``cli``), the cancel takes the owner's Undo path: the job's :meth:`on_undo`
        hooks run in the cancel's transaction (a hook that raises rolls it back; with
        ``commit=False`` it is your transaction, which you then roll back), and
        the owner's open toast says "Cancelled by an operator." Without one, the
        cancel is the app's own (``app``) and runs no hooks: the code that cancels
        does its own bookkeeping.

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
        return control.cancel(
            self._state(), id, key, owner, checked_actor(actor), commit=commit
        )

    def abort(self, id: int, *, actor: str | None = None) -> bool:
        """Stop job *id*: a pending job is cancelled (as :meth:`cancel`, hooks and all
        with an *actor*); a running one is asked to stop. True if this call did either;
        False when the job has settled already or its abort was asked for before.
        Unknown id → :class:`JobNotFound`.

        The worker running the job learns of the request within one heartbeat
        (``flask_defer.jobs.ABORT_CHECK_SECONDS``, half a second): a plain handler sees
        ``job.abort_requested()`` turn True and ends by raising
        :class:`~flask_defer.Aborted` (or by returning after it looked); a coroutine
        handler is cancelled (``asyncio.CancelledError`` at its next ``await``). The
        job then settles ``cancelled``, with an ``aborted`` history event naming
        *actor*, and its ``"done"`` children are cancelled with it. **A handler that
        never asks runs to its end**, and its outcome stands: Python cannot stop a
        thread from outside. ``atomic=True`` handlers that return commit their work
        and end done. Meanwhile the dashboard shows "abort requested".
        """
        return control.abort(self._state(), id, checked_actor(actor))

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
        ``commit=False`` joins the caller's transaction, as for :meth:`cancel`. With an
        ``actor`` (an operator, as for :meth:`cancel`), every cancelled job's
        :meth:`on_undo` hooks run in the same transaction; one that raises rolls back
        the whole bulk cancel (with ``commit=False``, roll your transaction back: it
        holds the cancels and the hooks' writes up to the one that raised).
        """
        return control.cancel_many(
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
        return control.reschedule(
            self._state(), id, key, run_at, delay, checked_actor(actor), commit=commit
        )

    def retry(self, id: int, *, actor: str | None = None, commit: bool = True) -> Job:
        """Put a failed job back to pending, due now, with its attempts reset.

        ``commit=False`` joins the caller's transaction, as for :meth:`cancel`.
        """
        return control.retry(self._state(), id, checked_actor(actor), commit=commit)

    def history(self, job_id: int) -> list[JobEvent]:
        """Every state change of job *job_id*, oldest first: what, when, who, which attempt.

        Written in the same transaction as each change, so it never disagrees with the
        row; pruned with its job. Empty for an unknown id (any integer no job has,
        0 and negative ones included, as ``get`` answers None for them) or with
        ``DEFER_HISTORY = False``; an id that is not an integer is
        :class:`InvalidArgument`.
        """
        try:
            checked, _ = identity(job_id, None)
        except JobNotFound:
            return []  # an id no row can have (≤ 0 or past 64 bits): unknown, like any
        assert checked is not None
        return reads.history(self._state(), checked)

    # -- reads --------------------------------------------------------------------

    def get(self, id: int | None = None, *, key: str | None = None) -> Job | None:
        """The job with this id; for a key, its live job, else the newest settled one."""
        try:
            job_id, key = identity(id, key)
        except JobNotFound:
            return None  # an id no row can have (≤ 0 or past 64 bits): unknown, like any
        return reads.get(self._state(), job_id, key)

    def list(
        self, *, limit: int = 100, offset: int = 0, **filters: Unpack[Filters]
    ) -> list[Job]:
        """Jobs matching every given filter, newest first, at most *limit*."""
        return reads.find(self._state(), filters, limit=limit, offset=offset)

    def health(self, now: datetime | None = None) -> Health:
        """Scheduled vs owed work, the oldest owed job's age, dead letters, lapsed leases."""
        return reads.health(self._state(), now)

    # -- running ------------------------------------------------------------------

    def run_due(
        self,
        now: datetime | None = None,
        *,
        limit: int | None = None,
        max_seconds: Duration | None = None,
        actor: str | None = None,
    ) -> RunSummary:
        """Claim and run every job due at *now* in this thread, then return a summary.

        For tests and cron: ``defer.run_due(now=datetime.now(UTC) + timedelta(hours=1))``
        runs what would be due in an hour. Retries are scheduled relative to *now*.
        The claim, execution and acknowledgement are the worker's own code, and so are
        the two steps that make it a complete cron runner: before claiming it returns
        jobs with lapsed leases to pending (a run that was killed, with no worker
        anywhere to notice), and while it runs it renews the leases of the jobs it
        holds, so a worker beside it never starts one of them a second time.
        ``limit`` caps the handlers it starts (the summary counts the outcomes written:
        one the database refused and dropped runs again after its lease, and is not
        counted). ``max_seconds`` stops claiming and starting jobs once that much time has
        passed (claimed jobs not started yet go back to pending): a cron run cannot
        overlap the next, except for the handler running at the limit. ``actor`` is
        who the job history says ran the jobs (default ``app``; the CLI passes ``cli``).
        """
        return running.run_due(
            self._state(), now, limit=limit, max_seconds=max_seconds, actor=actor
        )

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
        self._require_current_schema()
        return running.worker(
            state, concurrency=concurrency, queues=queues, burst=burst, clock=clock
        )

    def prune(self, now: datetime | None = None) -> int:
        """Delete settled jobs past their retention now; return how many.

        done, cancelled and expired rows older than ``DEFER_RETENTION``, failed ones
        older than ``DEFER_FAILED_RETENTION``. Workers do this periodically by themselves.
        """
        return running.prune(self._state(), now)
