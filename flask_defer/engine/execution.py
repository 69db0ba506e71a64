"""Run one claimed job and record its outcome: the code ``run_due`` and the worker share.

The executor knows nothing of Flask. It is handed a *context factory* (the extension
passes one that pushes an app context) and an *atomic scope* (a transaction on the
app's session, for ``atomic=True`` handlers), and a clock.

Over 400 lines because it is one class, the one place where every way a handler can
end (done, retried, failed, snoozed, aborted, timed out, unknown, a result that cannot
be stored) becomes its acknowledgement, its log line and its signal; split, each part
would reach into the other's state.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from .. import signals, tracing
from ..config import RetryPolicy
from ..jobs import ABORTS, Aborted, Fail, Job, JobStatus, NotYet, RetryAfter
from ..registry import Registry
from ..store import UNKNOWN_HANDLER_NOTE, Ack, JobStore
from .coroutines import AbortedTask, HandlerTimeout, awaited, run_coroutine
from .logs import brief
from .outcomes import (
    JobLog,
    Outcome,
    PendingAck,
    RunSummary,
    UnstorableResult,
    abort_note,
    asked_again,
    duration,
    error_summary,
    error_text,
    storable,
)
from .retry import backoff_delay

__all__ = [  # noqa: RUF022 - grouped: the executor, then what it re-exports
    "Clock", "Executor", "HandlerTimeout", "JobLog", "Outcome", "PendingAck", "RunSummary",
    "UnstorableResult", "error_summary",
]  # fmt: skip

logger = logging.getLogger("flask_defer")

ContextFactory = Callable[[], AbstractContextManager[Any]]
AtomicScope = Callable[[], AbstractContextManager[Connection]]
#: Sends one of :mod:`flask_defer.signals` for a job: ``emit(signal, job=..., **extra)``.
#: The per-app state supplies it, so signals are sent from one place with the app as sender.
Emit = Callable[..., None]
Clock = Callable[[], datetime]
#: Inside the context: True when the handler's session holds jobs it did not commit.
UncommittedCheck = Callable[[], bool]

#: The ``last_error`` note of a done job whose handler left scheduled jobs uncommitted.
UNCOMMITTED_NOTE = (
    "warning: the handler scheduled jobs in db.session and returned without committing; "
    "they were discarded (call db.session.commit() in the handler, or use atomic=True)"
)


class _LeaseLost(Exception):
    """Internal: the done mark was refused, so the atomic transaction must roll back."""


class Executor:
    """Runs claimed jobs one at a time and acknowledges each outcome."""

    def __init__(
        self,
        store: JobStore,
        registry: Registry,
        *,
        policy: RetryPolicy,
        context_factory: ContextFactory,
        atomic_scope: AtomicScope,
        emit: Emit,
        uncommitted: UncommittedCheck | None = None,
        sqlite_busy_timeout: timedelta | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.policy = policy
        self.context_factory = context_factory
        self.atomic_scope = atomic_scope
        self.emit = emit
        self.uncommitted = uncommitted
        # SQLite: an atomic handler that writes holds the one write lock until its done
        # mark commits; past the busy timeout other writers have started failing.
        self.lock_warning = sqlite_busy_timeout if store.driver.serialises_writes else None

    def execute(
        self, job: Job, clock: Clock, *, batch: bool = False, actor: str = "app"
    ) -> Outcome | PendingAck:
        """Run *job*'s handler and acknowledge the result with compare-and-set.

        With ``batch=True`` the acknowledgement of a non-atomic handler is not written
        here: a :class:`PendingAck` is returned, to be written with others by
        :meth:`flush` (one statement for the batch), which then logs the outcome,
        sends its signal and says whether the claim was lost. ``atomic=True`` handlers
        always acknowledge in their own transaction and return the :class:`Outcome`.
        *actor* (the worker, or ``app`` for ``run_due``) is who the outcome's history
        event names when it is written here; a batch names its actor at :meth:`flush`.
        """
        try:
            return self._execute(job, clock, batch=batch, actor=actor)
        finally:  # this run's abort request, if any, is settled either way
            ABORTS.forget(job.id, job.claim_token)

    def _execute(self, job: Job, clock: Clock, *, batch: bool, actor: str) -> Outcome | PendingAck:
        log = JobLog(logger, {"job": job})
        spec = self.registry.get(job.name)
        if spec is None:
            return self._unknown(job, log, clock, batch, actor)
        self._begin(job, log)
        note: str | None = None
        began = time.monotonic()
        try:
            with self.context_factory(), tracing.run_span(job):
                if spec.atomic:
                    with self.atomic_scope() as conn:
                        began = time.monotonic()
                        result = storable(spec.func(job))
                        self._warn_if_lock_held(conn, log, time.monotonic() - began)
                        if not self.store.ack_done(
                            job, now=clock(), result=result, conn=conn, actor=actor
                        ):
                            raise _LeaseLost()
                    return self._succeeded(job, log, time.monotonic() - began, acknowledged=True)
                if spec.is_async:
                    # run_due and other synchronous callers: the coroutine on a loop of
                    # its own (the worker runs coroutine handlers on its event loop).
                    result = storable(run_coroutine(spec.func(job)))
                else:
                    result = storable(spec.func(job))
                note = self._uncommitted_note(log)
        except BaseException as error:  # noqa: BLE001 - mapped to its outcome below
            return self._ended_with(job, log, error, clock, actor, batch)
        if ABORTS.was_seen(job.id, job.claim_token):
            return self._aborted(job, log, None, clock, actor)  # it saw the request and stopped
        return self._done(job, log, result, note, time.monotonic() - began, clock, actor, batch)

    async def execute_async(
        self, job: Job, clock: Clock, *, timeout: float | None, actor: str = "app"
    ) -> Outcome | PendingAck:
        """Await a coroutine handler's job on the running event loop (the worker's).

        As :meth:`execute` with ``batch=True``; *timeout* is enforced by cancelling the
        coroutine, which is then a failed attempt like a thread handler's timeout. A
        cancellation from outside (a worker stopping past its grace) propagates: the
        worker hands that job back to pending.
        """
        log = JobLog(logger, {"job": job})
        spec = self.registry.get(job.name)
        if spec is None:
            return self._unknown(job, log, clock, True, actor)
        self._begin(job, log)
        note: str | None = None
        began = time.monotonic()
        try:
            with self.context_factory(), tracing.run_span(job):
                result = storable(await awaited(job, spec.func(job), timeout))
                note = self._uncommitted_note(log)
            if ABORTS.was_seen(job.id, job.claim_token):
                raise AbortedTask()  # it saw the request and returned
        except AbortedTask:
            return self._aborted(job, log, None, clock, actor)
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # noqa: BLE001 - mapped to its outcome below
            return self._ended_with(job, log, error, clock, actor, True)
        finally:
            ABORTS.forget(job.id, job.claim_token)
        return self._done(job, log, result, note, time.monotonic() - began, clock, actor, True)

    def _unknown(
        self, job: Job, log: JobLog, clock: Clock, batch: bool, actor: str
    ) -> Outcome | PendingAck:
        # A rolling deploy can put a job in the table before the worker that knows
        # it is up: wait, loudly, rather than failing it.
        run_at = clock() + self.policy.unknown_backoff
        log.warning("no handler registered in this worker; retrying at %s", run_at)
        ack = Ack(
            job.id,
            job.claim_token or "",
            JobStatus.PENDING.value,
            run_at=run_at,
            attempts_delta=-1,
            last_error=f"{UNKNOWN_HANDLER_NOTE} for {job.name!r} in the worker",
            attempt=job.attempts,
        )
        return self._record(PendingAck(ack, lambda _ok: Outcome.UNKNOWN, job), clock, batch, actor)

    def _begin(self, job: Job, log: JobLog) -> None:
        self.emit(signals.job_started, job=job)
        log.debug("started (attempt %d of %d)", job.attempts, job.max_attempts)

    def _uncommitted_note(self, log: JobLog) -> str | None:
        if self.uncommitted is not None and self.uncommitted():
            # The app context's teardown is about to roll these rows back.
            log.warning(UNCOMMITTED_NOTE)
            return UNCOMMITTED_NOTE
        return None

    def _done(
        self,
        job: Job,
        log: JobLog,
        result: Any,
        note: str | None,
        took: float,
        clock: Clock,
        actor: str,
        batch: bool,
    ) -> Outcome | PendingAck:
        done = Ack(
            job.id, job.claim_token or "", JobStatus.DONE.value, result=result,
            last_error=note, attempt=job.attempts,
        )  # fmt: skip
        refused = (
            None if result is None else partial(self._result_refused, job, log, clock, actor)
        )
        succeeded = PendingAck(
            done, lambda ok: self._succeeded(job, log, took, acknowledged=ok), job, refused
        )
        return self._record(succeeded, clock, batch, actor)

    def _result_refused(
        self, job: Job, log: JobLog, clock: Clock, actor: str, refused: Exception
    ) -> PendingAck | None:
        """What stands in for the outcome of a done *job* that the database *refused*:
        if for its result's size, a failure without retry, as for a result that cannot
        be stored (:class:`UnstorableResult`); else nothing (the outcome is dropped).
        The handler's effects happened, and dropped, its outcome would run it again
        after its lease, only for the same result to be refused, until its attempts
        ran out. Logged and signalled once written, like the outcome it stands for."""
        if not isinstance(refused, SQLAlchemyError) or not self.store.refuses_for_size(refused):
            return None
        error = UnstorableResult(
            f"the handler's result cannot be stored: the database refused it ({brief(refused)})"
        )
        failed = self._failed_attempt(
            job, log, error, None, clock, actor, final=True, batch=True, log_when_written=True
        )
        assert isinstance(failed, PendingAck)  # batch=True: handed back, not written
        return failed

    def _ended_with(
        self,
        job: Job,
        log: JobLog,
        error: BaseException,
        clock: Clock,
        actor: str,
        batch: bool,
    ) -> Outcome | PendingAck:
        """Map how a handler ended (NotYet, Fail, an error, SystemExit) to its outcome."""
        if isinstance(error, _LeaseLost):
            return self._lost(log)
        if isinstance(error, Aborted) or ABORTS.requested(job.id, job.claim_token):
            # Raised Aborted, or failed some other way after an abort was asked for:
            # either way the run ends as aborted, not as a failure to retry.
            return self._aborted(job, log, error, clock, actor)
        if isinstance(error, NotYet):
            until = error.resume_at(clock())
            log.info("not yet; runs again at %s", until.isoformat())
            ack = Ack(
                job.id, job.claim_token or "", JobStatus.PENDING.value, run_at=until,
                due_at=until, attempts_delta=-1, attempt=job.attempts,
            )  # fmt: skip
            snoozed = PendingAck(ack, lambda ok: Outcome.SNOOZED if ok else self._lost(log), job)
            return self._record(snoozed, clock, batch, actor)
        if isinstance(error, Fail):
            return self._failed_attempt(
                job, log, error, None, clock, actor, final=True, batch=batch
            )
        if isinstance(error, Exception):
            # A handler's RetryAfter is held to DEFER_RETRY_CAP too: it is the longest
            # wait between attempts, whoever asks for it.
            delay = min(error.delay, self.policy.cap) if isinstance(error, RetryAfter) else None
            return self._failed_attempt(job, log, error, delay, clock, actor, batch=batch)
        # SystemExit, KeyboardInterrupt...: recorded like any failure. Left unrecorded,
        # the job would sit running for a lease, run again and end as "lease lapsed"
        # with the real error lost.
        outcome = self._failed_attempt(job, log, error, None, clock, actor)
        if isinstance(error, KeyboardInterrupt | SystemExit) and (
            threading.current_thread() is threading.main_thread()
        ):
            raise error  # run_due under Ctrl-C or sys.exit(): the process means to stop
        return outcome

    def flush(self, pending: Sequence[PendingAck], clock: Clock, *, actor: str = "app",
              tried: Collection[tuple[int, str]] = ()) -> list[Outcome]:  # fmt: skip
        """Write *pending* acknowledgements in one batch; their outcomes, in order.

        A row whose claim no longer owns it (its lease lapsed and another worker took
        the job) is absent from the store's answer and comes back :attr:`Outcome.LOST`,
        exactly as a single acknowledgement would. The owned rows' history events, by
        *actor*, are written in the same statement (PostgreSQL) or transaction (SQLite).
        *tried*: jobs whose last write raised (see ``JobStore.acknowledged_before``).
        """
        if not pending:
            return []
        owned = self.store.acknowledge_many([p.ack for p in pending], now=clock(), actor=actor)
        if tried and len(owned) < len(pending):
            owned |= self.store.acknowledged_before(asked_again(pending, owned, tried), actor=actor)
        return [p.settle(p.ack.job_id in owned) for p in pending]

    def _record(
        self, pending: PendingAck, clock: Clock, batch: bool, actor: str
    ) -> Outcome | PendingAck:
        if batch:
            return pending
        return self.flush([pending], clock, actor=actor)[0]

    def _warn_if_lock_held(self, conn: Connection, log: JobLog, held: float) -> None:
        """SQLite: warn when an atomic handler kept the write lock past the busy timeout."""
        if self.lock_warning is None or held <= self.lock_warning.total_seconds():
            return
        driver = conn.connection.driver_connection
        if not getattr(driver, "in_transaction", False):
            return  # the handler only read: it took no write lock
        log.warning(
            "atomic handler held the SQLite write lock for up to %.1f s, longer than "
            "DEFER_SQLITE_BUSY_TIMEOUT (%g s): other writers (web requests, workers) "
            "that waited on it that long failed with 'database is locked'",
            held,
            self.lock_warning.total_seconds(),
        )

    def time_out(self, job: Job, timeout: float, clock: Clock, *, actor: str = "app") -> Outcome:
        """Record that *job*'s handler overran *timeout* seconds: a failed attempt.

        The worker calls this from its loop while the handler's thread may still be
        running; the job is retried or failed per its attempts, like any exception.
        If the handler returns later, its acknowledgement is refused by the claim
        token compare-and-set, so the late result cannot overwrite this outcome.
        """
        log = JobLog(logger, {"job": job})
        error = HandlerTimeout(f"handler ran longer than its timeout of {timeout:g} s")
        outcome = self._failed_attempt(job, log, error, None, clock, actor)
        assert isinstance(outcome, Outcome)
        return outcome

    def _succeeded(self, job: Job, log: JobLog, took: float, *, acknowledged: bool) -> Outcome:
        if not acknowledged:
            return self._lost(log)
        # DEBUG, not INFO: a line per job cost a no-op job about as much as all the
        # rest of its run (profiled: ~100 of ~220 µs); the worker logs a summary of its
        # outcomes instead, and every failure still has a line of its own.
        log.debug(
            "done in %s (attempt %d of %d)", duration(took), job.attempts, job.max_attempts
        )
        self.emit(signals.job_succeeded, job=job)
        return Outcome.DONE

    def _failed_attempt(
        self,
        job: Job,
        log: JobLog,
        error: BaseException,
        delay: timedelta | None,
        clock: Clock,
        actor: str,
        *,
        final: bool = False,
        batch: bool = False,
        log_when_written: bool = False,
    ) -> Outcome | PendingAck:
        """The outcome of a failed attempt: retried, or failed for good when *final* or
        out of attempts. Logged at once (when decided), or with *log_when_written* only
        once it is written: for an outcome that may never be."""
        text = error_text(error)
        now = clock()
        token = job.claim_token or ""
        # ``final``: the handler raised Fail, so attempts left do not matter.
        will_retry = not final and job.attempts < job.max_attempts
        if will_retry:
            if delay is None:
                delay = backoff_delay(job.attempts, base=self.policy.base, cap=self.policy.cap)
            run_at = now + delay
            level, message = logging.WARNING, "attempt %d failed, retrying at %s: %s"
            args: tuple[Any, ...] = (job.attempts, run_at, error_summary(error))
            ack = Ack(
                job.id, token, JobStatus.PENDING.value, run_at=run_at, last_error=text,
                attempt=job.attempts,
            )  # fmt: skip
        else:
            level = logging.ERROR
            message = "failed without retry (attempt %d): %s" if final else (
                "failed after %d attempts: %s"
            )
            args = (job.attempts, error_summary(error))
            ack = Ack(
                job.id, token, JobStatus.FAILED.value, last_error=text, attempt=job.attempts
            )

        if not log_when_written:
            log.log(level, message, *args)

        def settle(ok: bool) -> Outcome:
            if not ok:
                return self._lost(log)
            if log_when_written:
                log.log(level, message, *args)
            self.emit(signals.job_failed, job=job, error=text, will_retry=will_retry)
            return Outcome.RETRIED if will_retry else Outcome.FAILED

        return self._record(PendingAck(ack, settle, job), clock, batch, actor)

    def _aborted(
        self, job: Job, log: JobLog, error: BaseException | None, clock: Clock, actor: str
    ) -> Outcome:
        """Settle a run that stopped on an abort request: ``cancelled``, written now
        (aborts are rare; its event names who asked, which a batch cannot)."""
        if not self.store.ack_aborted(job, now=clock(), note=abort_note(error), actor=actor):
            return self._lost(log)
        log.info("aborted on request (attempt %d)", job.attempts)
        self.emit(signals.job_cancelled, job=job)
        return Outcome.ABORTED

    @staticmethod
    def _lost(log: JobLog) -> Outcome:
        log.warning("lease lapsed before acknowledgement; outcome discarded")
        return Outcome.LOST

