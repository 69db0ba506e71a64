"""The long-running worker: claim due jobs, run them on a thread pool, acknowledge.

One loop, in the thread that calls :meth:`Worker.run`:

1. record handlers that overran their timeout as failed attempts;
2. reclaim lapsed leases and prune history when due (one worker at a time);
3. claim as many due jobs as the pool has room for (free threads plus one prefetched
   ``DEFER_CLAIM_BATCH``) through the :class:`~flask_defer.runner.Runner` — the same
   claim and execution as ``run_due`` — and hand them to the pool, which runs each
   inside a fresh app context;
4. sleep until the next job's ``run_at``, a free thread, a handler's timeout, the next
   maintenance round or a NOTIFY, whichever comes first (bounded by ``max_sleep``;
   SQLite, which cannot notify, polls every ``poll_interval``).

A heartbeat thread renews the leases of running jobs every lease/3, so a job is only
reclaimed when its worker really stopped. SIGTERM/SIGINT stop claiming, give running
handlers ``shutdown_grace`` to finish, release the rest to pending and return; a second
signal exits at once. A lost database connection is logged and retried with a backoff.

The worker imports no Flask: the app context comes from the executor's context
factory, which the extension supplies.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import replace
from datetime import datetime
from types import FrameType
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError

from .config import DeferConfig, WorkerOptions
from .execution import Clock, Executor, JobLog, Outcome, PendingAck, RunSummary
from .jobs import Job
from .leases import LeaseHeartbeat
from .leases import brief as _brief
from .maintenance import Maintenance
from .pool import HandlerPool
from .runner import Runner
from .store import JobStore
from .timeutil import utcnow
from .wake import Wake, Waker

if TYPE_CHECKING:
    from .helpers.recurring import Ticker

logger = logging.getLogger("flask_defer.worker")

#: Longest pause between attempts to reach a database that is down.
MAX_ERROR_BACKOFF = 5.0
#: Shortest sleep when work is due but could not be claimed (another worker holds it).
MIN_SLEEP = 0.001


class Worker:
    """Runs due jobs until stopped (or, with ``burst``, until nothing is due)."""

    def __init__(
        self,
        store: JobStore,
        executor: Executor,
        options: WorkerOptions,
        *,
        clock: Clock = utcnow,
        ticker: Ticker | None = None,
    ) -> None:
        self.store = store
        #: Recurring schedules: synced at start, their due ticks written each round.
        self.ticker = ticker
        self._next_tick: datetime | None = None
        self._tick_recheck = 0.0
        self.executor = executor
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        #: Who this worker's claims, outcomes and reclaims are in the job history.
        self.actor = f"worker:{self.name}"
        # The claim and the execution are run_due's own (one runner, one claim path).
        self.runner = Runner(
            store,
            executor,
            lease=options.lease,
            claim_batch=options.claim_batch,
            actor=self.actor,
        )
        self.registry = executor.registry
        self.options = options
        self.clock = clock
        self.summary = RunSummary()
        self._summary_lock = threading.Lock()
        self._stop = threading.Event()
        self._started = False
        queues = options.queues
        self.waker = Waker(store.open_listener if store.can_listen else None, queues=queues)
        if store.is_postgres and not store.can_listen:
            logger.warning(
                "LISTEN/NOTIFY needs the psycopg 3 driver (postgresql+psycopg://); "
                "this worker polls every %g s instead",
                options.poll_interval.total_seconds(),
            )
        # Prefetch one claim batch: with every thread busy, the next jobs are already
        # claimed (their leases renewed by the heartbeat), so a finishing thread never
        # waits for a round trip. Other workers still get the rest of the backlog.
        # Prefetched jobs are claimed without counting an attempt; it is counted when a
        # thread starts one, so a killed worker's queue costs its jobs no attempt.
        self.pool = HandlerPool(
            options.concurrency,
            lambda job: self.runner.execute(job, self.clock, batch=True),
            self._finished,
            prefetch=options.claim_batch,
            start=lambda job: store.start_claimed(job, now=self.clock(), actor=self.actor),
        )
        # Handlers' outcomes waiting for the loop to write them in one batch, each
        # with whether it counts in the summary (False: abandoned at its timeout).
        self._acks: list[tuple[PendingAck, bool]] = []
        self._acks_lock = threading.Lock()
        self._ack_deadline: float | None = None
        # Claim a batch only once a batch of slots is free, unless the last claim
        # found fewer due jobs than it asked for (then a job that comes due must not
        # wait for others to finish).
        self._backlog = False
        self.maintenance = Maintenance(store, options.maintenance, clock, actor=self.actor)
        # The same heartbeat as run_due's, over the pool's claimed jobs.
        self._heartbeat = LeaseHeartbeat(store, options.lease, clock, self.pool.in_flight)
        self._db_failures = 0

    # -- control ------------------------------------------------------------------

    def run(self, *, install_signal_handlers: bool = True) -> RunSummary:
        """Run until :meth:`stop` (or a signal); return counts of what was run.

        Signal handlers are installed only when called from the main thread.
        """
        if self._started:
            raise RuntimeError("a Worker runs once; create a new one to run again")
        self._started = True
        restore = self._install_signal_handlers() if install_signal_handlers else None
        try:
            self.waker.start()
            self.pool.start()
            self._heartbeat.start()
            self._warn_if_pool_too_small()
            if self.ticker is not None:
                self.ticker.sync(self.clock())
            logger.info(
                "worker %s started: %d thread(s), queues %s, %s%s",
                self.name,
                self.options.concurrency,
                ",".join(self.options.queues) if self.options.queues else "all",
                self.store.engine.dialect.name,
                " (LISTEN)" if self.waker.listening else "",
            )
            self._loop()
        finally:
            self._shutdown()
            if restore is not None:
                restore()
        logger.info("worker %s stopped: %s", self.name, _summary_text(self.summary))
        return self.summary

    def stop(self) -> None:
        """Ask the worker to stop claiming and shut down gracefully (thread-safe)."""
        self._stop.set()
        self.waker.wake()

    @property
    def stopping(self) -> bool:
        """True once a stop was requested."""
        return self._stop.is_set()

    # -- the loop -----------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                sleep = self._step()
            except SQLAlchemyError as error:
                sleep = self._database_failed(error)
            else:
                if self._db_failures:
                    logger.info("database reachable again; carrying on")
                    self._db_failures = 0
            if sleep is None:
                return  # burst: nothing more is due
            if sleep > 0 and not self._stop.is_set():
                woke = self.waker.wait(sleep)
                if woke in (Wake.NOTIFY, Wake.RECONNECTED):
                    # A schedule may have been resumed or added elsewhere (they notify):
                    # look at the schedules table again instead of at the next poll.
                    self._tick_recheck = 0.0

    def _step(self) -> float | None:
        """One round: time-outs, maintenance, acks, claim. Returns how long to sleep."""
        self._record_timeouts()
        self.maintenance.run_if_due()
        mono = time.monotonic()
        deadline = self._ack_deadline
        if deadline is not None and (deadline <= mono or self._stop.is_set()):
            self._flush_acks()
        if self._stop.is_set():
            return 0.0
        opts = self.options
        self._write_ticks()
        now = self.clock()
        free = self.pool.free()
        claimed = 0
        if free and free >= self._claim_threshold():
            limit = min(free, opts.claim_batch)
            # Jobs for idle threads start at once: their claim counts the attempt.
            # The rest wait in the queue and count it when they start (one more
            # statement each, only when every thread is busy).
            starting = min(self.pool.idle(), limit)
            for count, spent in ((starting, True), (limit - starting, False)):
                if not count:
                    continue
                jobs = self.runner.claim(now, count, queues=opts.queues, spend_attempt=spent)
                for job in jobs:
                    self.pool.submit(job, self._timeout_for(job.name), spent=spent)
                claimed += len(jobs)
                if len(jobs) < count:
                    break  # nothing more is due
            self._backlog = claimed == limit
            if claimed == limit and self.pool.free() >= self._claim_threshold():
                return 0.0  # a full batch and room for another: more may be due now
            free -= claimed
        waits = [opts.max_sleep.total_seconds()]
        next_run_at = None
        if free and not self._backlog:
            next_run_at = self.store.next_run_at(queues=opts.queues)
            if next_run_at is not None:
                waits.append((next_run_at - self.clock()).total_seconds())
            if not self.waker.listening:
                waits.append(opts.poll_interval.total_seconds())
        if self._next_tick is not None and self._next_tick > now:
            # A tick due before any job must wake the loop too, or it would be late. (One
            # still due after _write_ticks is a schedule that failed: no busy loop on it.)
            waits.append((self._next_tick - self.clock()).total_seconds())
        # With every thread busy there is nothing to claim; a finishing handler wakes us.
        mono = time.monotonic()
        deadline = self.pool.next_deadline()
        if deadline is not None:
            waits.append(deadline - mono)
        ack_deadline = self._ack_deadline
        if ack_deadline is not None:
            waits.append(ack_deadline - mono)
        if not opts.burst:
            waits.append(self.maintenance.next_due() - mono)
        elif (
            not claimed
            and not self.pool.busy()
            and ack_deadline is None
            and (next_run_at is None or next_run_at > now)
        ):
            return None
        return max(min(waits), 0.0 if claimed else MIN_SLEEP)

    def _claim_threshold(self) -> int:
        """Free slots worth a claim: half a batch while the backlog lasts, else one.

        Half, not a whole one: the claim's round trip (a commit, an fsync) then
        overlaps the other half still queued, so the threads never wait for it.
        """
        if not self._backlog or not self.pool.busy():
            return 1
        return max(1, min(self.options.claim_batch, self.pool.size + self.pool.prefetch) // 2)

    def _flush_acks(self) -> None:
        """Write every handed-in outcome in one batch (compare-and-set per row).

        The one place acknowledgements are written: on a database error the batch is
        kept and written on a later round (its leases lapse meanwhile only if the
        outage outlasts them, and then the compare-and-set reports the claims lost).
        """
        with self._acks_lock:
            batch, self._acks = self._acks, []
            self._ack_deadline = None
        if not batch:
            return
        try:
            outcomes = self.runner.flush([pending for pending, _ in batch], self.clock)
        except BaseException:
            with self._acks_lock:
                self._acks[:0] = batch
                self._ack_deadline = time.monotonic()
            raise
        for outcome, (_, counted) in zip(outcomes, batch, strict=True):
            if counted:
                self._count(outcome)

    def _write_ticks(self) -> None:
        """Write the jobs of due recurring ticks, and learn when the next tick is.

        The schedules table is read when a known tick is due, and otherwise every
        ``poll_interval`` (another process may have resumed or changed a schedule), so
        an idle worker costs the table one indexed read per poll.
        """
        if self.ticker is None:
            return
        mono = time.monotonic()
        now = self.clock()
        if mono < self._tick_recheck and (self._next_tick is None or self._next_tick > now):
            return
        self.ticker.materialise(now)
        self._next_tick = self.ticker.next_due()
        self._tick_recheck = mono + self.options.poll_interval.total_seconds()

    def _record_timeouts(self) -> None:
        for task in self.pool.expire():
            try:
                outcome = self.executor.time_out(
                    task.job, task.timeout or 0.0, self.clock, actor=self.actor
                )
            except SQLAlchemyError as error:
                JobLog(logger, {"job": task.job}).warning(
                    "could not record the timeout (%s); the job returns to pending "
                    "when its lease lapses",
                    _brief(error),
                )
                continue
            self._count(outcome)

    def _timeout_for(self, name: str) -> float | None:
        spec = self.registry.get(name)
        if spec is None:
            return None  # unknown here: the executor only snoozes it
        if spec.timeout is not None:
            return spec.timeout
        return self.options.job_timeout.total_seconds()

    def _finished(self, result: Outcome | PendingAck, counted: bool) -> None:
        """A handler returned (on its thread): batch its acknowledgement, maybe wake."""
        wake = False
        if isinstance(result, PendingAck):
            with self._acks_lock:
                self._acks.append((result, counted))
                if self._ack_deadline is None:
                    # The first of a batch: the loop must learn when to flush it.
                    self._ack_deadline = time.monotonic() + self.options.ack_flush.total_seconds()
                    wake = True
        else:
            if counted:
                self._count(result)
        # A thread is free; the loop claims once a batch of slots is (or at once when
        # the backlog is short), so finishing handlers do not each cost a claim.
        if wake or self.pool.free() >= self._claim_threshold():
            self.waker.wake()

    def _count(self, outcome: Outcome) -> None:
        with self._summary_lock:
            self.summary.add(outcome)

    def _database_failed(self, error: SQLAlchemyError) -> float:
        self._db_failures += 1
        delay = min(0.1 * 2.0 ** min(self._db_failures - 1, 10), MAX_ERROR_BACKOFF)
        logger.warning(
            "database error in the worker loop (%s); retrying in %.1f s", _brief(error), delay
        )
        return delay

    # -- shutdown -----------------------------------------------------------------

    def _shutdown(self) -> None:
        """Let running handlers finish within the grace period; release the rest."""
        grace_ends = time.monotonic() + self.options.shutdown_grace.total_seconds()
        # Prefetched jobs that no thread started go back at once, not after the grace.
        withdrawn = self.pool.withdraw_queued()
        self._release([t.job for t in withdrawn if t.spent], "claimed but not started")
        self._release(
            [t.job for t in withdrawn if not t.spent], "claimed but not started", spent=False
        )
        if self.pool.busy():
            logger.info(
                "waiting up to %g s for %d running job(s)",
                self.options.shutdown_grace.total_seconds(),
                len(self.pool.in_flight()),
            )
        while self.pool.busy():
            try:
                self._record_timeouts()
            except Exception:  # noqa: BLE001 - shutting down regardless
                logger.exception("recording timeouts during shutdown failed")
            now = time.monotonic()
            if now >= grace_ends:
                break
            wait = grace_ends - now
            deadline = self.pool.next_deadline()
            if deadline is not None:
                wait = min(wait, max(deadline - now, MIN_SLEEP))
            self.pool.wait_idle(wait)
        try:
            self._flush_acks()
        except SQLAlchemyError as error:
            logger.error(
                "could not write %d outcome(s) at shutdown (%s); those jobs run again "
                "when their leases lapse",
                len(self._acks),
                _brief(error),
            )
        self._release(self.pool.in_flight(), "still running after the shutdown grace period")
        self._heartbeat.stopped.set()
        self.pool.close()
        self.waker.close()

    def _release(self, jobs: list[Job], why: str, *, spent: bool = True) -> None:
        """Hand *jobs* back to pending (attempt not spent), logging each one."""
        if not jobs:
            return
        try:
            released = self.store.release(jobs, now=self.clock(), spent=spent)
        except SQLAlchemyError as error:
            logger.error(
                "could not release %d job(s) (%s); they return to pending when "
                "their leases lapse",
                len(jobs),
                _brief(error),
            )
            return
        for job in jobs:
            JobLog(logger, {"job": job}).warning("%s; released to pending", why)
        logger.info("released %d job(s) back to pending", released)

    def _install_signal_handlers(self) -> Callable[[], None] | None:
        if threading.current_thread() is not threading.main_thread():
            return None
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            name = signal.Signals(signum).name
            if self._stop.is_set():
                logger.warning("second %s: exiting at once", name)
                _flush_logs()
                os._exit(128 + signum)
            logger.info(
                "%s received: no new jobs; running ones get %g s to finish",
                name,
                self.options.shutdown_grace.total_seconds(),
            )
            self.stop()

        for sig in previous:
            signal.signal(sig, on_signal)

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore

    def _warn_if_pool_too_small(self) -> None:
        pool: Any = self.store.engine.pool
        size = getattr(pool, "size", None)
        overflow = getattr(pool, "_max_overflow", 0)
        if not callable(size) or overflow < 0:
            return  # not a QueuePool, or unbounded overflow
        # Each handler thread acknowledges on its own connection; the loop, the
        # heartbeat and the maintenance lock need one each.
        needed = self.options.concurrency + 3
        if size() + overflow < needed:
            logger.warning(
                "the engine's pool allows %d connections but this worker may need %d; "
                "raise pool_size/max_overflow (SQLALCHEMY_ENGINE_OPTIONS)",
                size() + overflow,
                needed,
            )


def make_worker(
    store: JobStore,
    executor: Executor,
    config: DeferConfig,
    *,
    concurrency: int | None = None,
    queues: Collection[str] | None = None,
    burst: bool = False,
    clock: Clock | None = None,
    ticker: Ticker | None = None,
    **overrides: Any,
) -> Worker:
    """A :class:`Worker` configured from *config*; *overrides* replace option fields."""
    options = config.worker_options(concurrency=concurrency, queues=queues, burst=burst)
    if overrides:
        options = replace(options, **overrides)
    return Worker(store, executor, options, clock=clock or utcnow, ticker=ticker)


def _summary_text(summary: RunSummary) -> str:
    parts = [f"{name} {n}" for name, n in summary.counts.items() if n]
    return f"ran {summary.ran} job(s)" + (f" ({', '.join(parts)})" if parts else "")


def _flush_logs() -> None:
    for handler in logging.getLogger().handlers + logging.getLogger("flask_defer").handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
    sys.stderr.flush()
