"""The long-running worker: claim due jobs, run them on a thread pool, acknowledge.

One loop, in the thread that calls :meth:`Worker.run`:

1. record handlers that overran their timeout as failed attempts;
2. reclaim lapsed leases and prune history when due (one worker at a time);
3. claim as many due jobs as the pool has idle threads through the
   :class:`~flask_defer.engine.runner.Runner` (the same claim as ``run_due``): the claim
   counts each job's attempt and writes its ``started`` event in one statement, and
   the pool hands each job to a thread, which runs it inside a fresh app context;
4. sleep until the next job's ``run_at``, a free thread, a handler's timeout, the next
   maintenance round or a NOTIFY, whichever comes first (bounded by ``max_sleep``;
   SQLite, which cannot notify, polls every ``poll_interval``).

Handlers' outcomes are written in batches by the :class:`~flask_defer.engine.ack_flusher.AckFlusher`
on a thread of its own, so a flush's durable commit overlaps the next claim. Coroutine
handlers (``async def``) run on one event loop (:mod:`flask_defer.engine.event_loop`) and hold
no thread while they wait.

A heartbeat renews running jobs' leases every lease/3. SIGTERM/SIGINT stop claiming,
give running handlers ``shutdown_grace`` to finish and release the rest (a second signal
exits at once). No Flask here: the app context comes from the executor's factory.

Over 400 lines because it is the one loop and the decisions it makes each round (when
to claim, how much, how long to sleep, when a burst run is over, what a freed key or a
timed-out handler means): the parts it drives have modules of their own, and cut in
two the loop would lose the reading order in which those decisions depend on each other.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from ..config import DeferConfig, WorkerOptions
from ..jobs import Job, JobStatus
from ..store import JobStore
from ..timeutil import utcnow
from . import stopping as _stopping
from .ack_flusher import AckFlusher
from .event_loop import CoroutineRunner
from .execution import Clock, Executor, JobLog, Outcome, PendingAck, RunSummary
from .leases import LeaseHeartbeat
from .logs import brief as _brief
from .maintenance import Maintenance
from .outcomes import ProgressLog
from .pool import HandlerPool, Task, warn_if_connections_short
from .presence import Presence
from .runner import Runner
from .stopping import release, wait_for_handlers
from .ticks import RecurringTicks, TickTimer
from .wake import Wake, Waker

logger = logging.getLogger("flask_defer.worker")

#: Longest pause between attempts to reach a database that is down.
MAX_ERROR_BACKOFF = 5.0
#: Shortest sleep when work is due but could not be claimed (another worker holds it).
MIN_SLEEP = 0.001
#: Longest a free thread waits for half the pool under a backlog before the loop
#: claims for it anyway: long jobs on the other threads must not hold due jobs back.
MAX_CLAIM_HOLD = 0.02


class Worker:
    """Runs due jobs until stopped (or, with ``burst``, until nothing is due)."""

    def __init__(
        self,
        store: JobStore,
        executor: Executor,
        options: WorkerOptions,
        *,
        clock: Clock = utcnow,
        ticker: RecurringTicks | None = None,
    ) -> None:
        # Long because: one attribute per part of the worker, each with why it is there.
        self.store = store
        #: Recurring schedules: synced at start, their due ticks written each round.
        self.ticks = TickTimer(ticker, options.poll_interval.total_seconds())
        self.executor = executor
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        #: Who this worker's claims, outcomes and reclaims are in the job history.
        self.actor = f"worker:{self.name}"
        # The claim and the execution are run_due's own (one runner, one claim path).
        self.runner = Runner(
            store, executor, lease=options.lease, claim_batch=options.claim_batch,
            actor=self.actor, adopts=True,
        )  # fmt: skip
        self.registry = executor.registry
        self.options = options
        self.clock = clock
        self.summary = RunSummary()
        self._summary_lock = threading.Lock()
        self._stop = threading.Event()
        self._started = False
        self.waker = _waker(store, options)
        # The claim asks for no more jobs than there are idle threads, so every claimed
        # job starts at once and the claim itself counts its attempt: a worker killed
        # at any moment has spent the attempts of the jobs its threads had, no others.
        self.pool = HandlerPool(
            options.concurrency,
            lambda job: self.runner.execute(job, self.clock, batch=True),
            self._finished,
            self._thread_freed,
            self._overrun_ended,
        )
        # Coroutine handlers: tasks of one event loop, started on the first such job.
        self.coroutines = CoroutineRunner(
            options.async_concurrency, self._finished, self._thread_freed
        )
        # Handlers' outcomes, written in batches on the flusher's own thread.
        self._acks = AckFlusher(
            self._flush, self._count, options.ack_flush.total_seconds(),
            refused=store.refuses_values, keeping=store.keeping_connections,
        )  # fmt: skip
        # Ids of the keyed jobs (a concurrency_key) this worker started and has not
        # acknowledged yet: their acknowledgement frees a slot of their key.
        self._keyed: dict[int, str] = {}
        # While the last claim found a full batch, claim again only once half the pool
        # is free: the claim's round trip then overlaps the other half's handlers.
        self._backlog = False
        self._claim_time = 0.0  # a moving average of a claim's round trip, in seconds
        self._claimed_at = 0.0  # when the last claim began (monotonic)
        self.maintenance = Maintenance(
            store, options.maintenance, clock, actor=self.actor, emit=executor.emit
        )
        # The same heartbeat as run_due's, over the pool's claimed jobs.
        self.presence = Presence(
            store, kind="worker", queues=options.queues, concurrency=options.concurrency,
            heartbeat_seconds=options.lease.total_seconds() / 3,
            listening=lambda: self.waker.listening if store.can_listen else None,
            names=executor.registry.names(),
        )  # fmt: skip
        self._heartbeat = LeaseHeartbeat(
            store, options.lease, clock, self._in_flight, presence=self.presence
        )
        self._db_failures = 0
        self._progress = ProgressLog(logger)

    # -- control ------------------------------------------------------------------

    def run(self, *, install_signal_handlers: bool = True) -> RunSummary:
        """Run until :meth:`stop` (or a signal); return counts of what was run.

        Signal handlers are installed only when called from the main thread.
        """
        if self._started:
            raise RuntimeError("a Worker runs once; create a new one to run again")
        self._started = True
        grace = self.options.shutdown_grace.total_seconds()
        restore = (
            _stopping.install_signal_handlers(self.stop, self._stop.is_set, grace)
            if install_signal_handlers
            else None
        )
        try:
            self.waker.start()
            self.pool.start()
            self._acks.start()
            self._heartbeat.start()
            # Each handler thread acknowledges on its own connection; the loop, the
            # heartbeat and the maintenance lock need one each.
            warn_if_connections_short(self.store.engine, self.options.concurrency)
            self.ticks.sync(self.clock())
            logger.info(
                "worker %s started: %d thread(s), queues %s, %s%s",
                self.name,
                self.options.concurrency,
                ",".join(self.options.queues) if self.options.queues else "all",
                self.store.driver.name,
                " (LISTEN)" if self.waker.listening else "",
            )
            # The loop claims every few milliseconds under a backlog: on one connection.
            with self.store.keeping_connections():
                self._loop()
        finally:
            self._shutdown()
            if restore is not None:
                restore()
        logger.info("worker %s stopped: %s", self.name, self.summary.text())
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
                    # A job added elsewhere may expire before any this worker knows of.
                    self.ticks.look_again()
                    self.maintenance.look_again_for_expiry()

    def _housekeeping(self) -> None:
        """What each round does before it claims: overrun handlers' time-outs, the
        maintenance round when due, expired jobs, the activity counts, the progress log."""
        self._record_timeouts()
        self.maintenance.run_if_due()
        self.maintenance.expire_if_due()
        self.runner.activity.flush_if_due()
        with self._summary_lock:
            self._progress.maybe_log(self.summary)

    def _step(self) -> float | None:
        """One round: housekeeping, then the claim. Returns how long to sleep.

        First, the jobs of a claim that raised but committed are started (see
        ``Runner.adopt_unanswered``): before housekeeping, whose reclaim would hand
        them back with an attempt spent once their lease lapsed.
        """
        for job in self.runner.adopt_unanswered(self.clock):
            self._start(job)
        self._housekeeping()
        if self._stop.is_set():
            return 0.0
        opts = self.options
        self.ticks.write_due(self.clock())
        now = self.clock()
        free = self._free()
        claimed = 0
        if free and free >= self._claim_threshold():
            free = self._gather_free(free)
            if self._stop.is_set():
                return 0.0  # asked to stop since the look above (or while gathering)
            limit = min(free, opts.claim_batch)
            began = self._claimed_at = time.monotonic()
            jobs = self.runner.claim(now, limit, queues=opts.queues, look_first=not self._backlog)
            self._claim_time += (time.monotonic() - began - self._claim_time) / 8
            for job in jobs:
                self._start(job)
            claimed = len(jobs)
            self._backlog = claimed == limit
            if self._backlog and self._free() >= self._claim_threshold():
                return 0.0  # a full batch and room for another: more may be due now
            free -= claimed
        waits = [opts.max_sleep.total_seconds()]
        next_run_at = None
        if free and not self._backlog:
            next_run_at = self.store.next_run_at(queues=opts.queues, now=now)
            if next_run_at is not None:
                waits.append((next_run_at - self.clock()).total_seconds())
            if not self.waker.listening:
                waits.append(opts.poll_interval.total_seconds())
        waits.extend(self._timers(now))
        if opts.burst and not claimed and not self._busy():
            if not self._acks.idle():
                # Outcomes not written yet may free a concurrency key's slot: a burst
                # run ends only once they are written and nothing it could run is left.
                waits.append(opts.ack_flush.total_seconds())
            elif next_run_at is None or next_run_at > now:
                return self._end_of_burst(now)
        return max(min(waits), 0.0 if claimed else MIN_SLEEP)

    def _timers(self, now: datetime) -> list[float]:
        """What else must end the loop's sleep, in seconds from now: the backlog's hold,
        the next recurring tick, a handler's timeout and, unless a burst run, the
        maintenance round and the next expiry."""
        waits: list[float] = []
        hold_left = self._claimed_at + MAX_CLAIM_HOLD - time.monotonic()
        if self._backlog and hold_left > 0:
            # Held for half the pool: look again once the hold is over, when one free
            # thread is worth a claim (a thread freed meanwhile did not wake the loop).
            waits.append(hold_left)
        tick_wait = self.ticks.wait(now, self.clock())
        if tick_wait is not None:
            waits.append(tick_wait)  # a tick due before any job must wake the loop too
        # With every thread busy there is nothing to claim; a freed thread wakes us.
        deadline = self.pool.next_deadline()
        if deadline is not None:
            waits.append(deadline - time.monotonic())
        if not self.options.burst:
            waits.append(self.maintenance.next_due() - time.monotonic())
            expiry = self.maintenance.next_expiry_due()
            if expiry is not None:
                waits.append(expiry - time.monotonic())
        return waits

    def _end_of_burst(self, now: datetime) -> float | None:
        """None when a burst run that runs nothing and owes no outcome is over, else the
        sleep before it claims again (:data:`MIN_SLEEP`, as for any due job a claim
        did not get).

        The round's own look for the next due job may predate outcomes written since
        (a handler that ended after the claim): one that freed a concurrency key's
        slot makes the key's next job due. Nothing runs and nothing is owed now, so
        this look is final.
        """
        queues = self.options.queues
        again = self.store.next_run_at(queues=queues, now=now)
        if again is not None and again <= now:
            return MIN_SLEEP
        self.summary.left = self.store.count_due(now=now, queues=queues)
        if self.summary.left:
            logger.info(
                "burst run ends with %d due job(s) left: held by a paused queue "
                "or name, or by a concurrency key another worker holds",
                self.summary.left,
            )
        return None

    def _flush(
        self, batch: Sequence[PendingAck], tried: Collection[tuple[int, str]]
    ) -> list[Outcome]:
        """Write a batch of outcomes (*tried*: see ``Executor.flush``); a keyed one freed
        a slot of its key, so the loop (and, where the database wakes them, other
        workers) claims again at once rather than at the next poll; a retry or a snooze
        wakes the loop to see its new ``run_at``.

        The other workers' wake-up is best effort: the outcomes are written and
        settled (logged, signalled) by then, and an error here must not make the
        flusher write and settle them again.
        """
        outcomes = self.runner.flush(batch, self.clock, tried=tried)
        freed = {self._keyed.pop(p.ack.job_id, None) for p in batch} - {None}
        if freed or any(p.ack.status == JobStatus.PENDING.value for p in batch):
            # A retry or a snooze is pending again, due at its run_at: the loop's last
            # look for the next due job saw it running, so it must look again rather
            # than sleep until DEFER_MAX_SLEEP.
            self.waker.wake()
        if freed:
            try:
                self.store.wake_workers({queue for queue in freed if queue is not None})
            except SQLAlchemyError as error:
                logger.warning("could not wake other workers (%s)", _brief(error))
        return outcomes

    def _start(self, job: Job) -> None:
        """Hand a claimed job to a thread, or a coroutine handler's to the event loop."""
        if job.concurrency_key is not None:
            self._keyed[job.id] = job.queue
        timeout = self._timeout_for(job.name)
        spec = self.registry.get(job.name)
        if spec is not None and spec.is_async:
            self.coroutines.submit(
                job,
                lambda: self.executor.execute_async(
                    job, self.clock, timeout=timeout, actor=self.actor
                ),
            )
        else:
            self.pool.submit(job, timeout)

    def _free(self) -> int:
        """How many jobs to claim now: one per idle thread, no more than the loop has room for.

        A coroutine handler's job leaves its thread's slot at once (it runs on the
        event loop), so a thread that claims one is free for the next claim.
        """
        return min(self.pool.free(), self.coroutines.room())

    def _busy(self) -> bool:
        return self.pool.busy() or self.coroutines.busy()

    def _in_flight(self) -> list[Job]:
        return self.pool.in_flight() + self.coroutines.in_flight()

    def _gather_free(self, free: int) -> int:
        """Under a backlog of short jobs, wait a moment for the rest of the pool to free.

        A claim costs about the same for one job as for a pool's worth, so when the
        running handlers are likely to end sooner than a claim takes (their average
        run time is shorter), waiting up to one claim's time for them makes the claim
        larger and the claims fewer. The wait is bounded, so a long job never holds the
        other threads idle for more than that moment.
        """
        if not self._backlog or free >= self.pool.size or self.pool.run_time >= self._claim_time:
            return free
        self.pool.wait_idle(self._claim_time)
        return self._free()

    def _claim_threshold(self) -> int:
        """Free threads worth a claim: half the pool while the backlog lasts, else one.

        Half the pool only for :data:`MAX_CLAIM_HOLD` after the last claim: a backlog
        is read from a claim that filled every free thread, which says nothing of how
        long the other handlers run. Past the hold one free thread is worth a claim
        again, so long jobs never keep due ones from idle threads.
        """
        if not self._backlog or not self._busy():
            return 1
        if time.monotonic() - self._claimed_at >= MAX_CLAIM_HOLD:
            return 1
        return max(1, min(self.options.claim_batch, self.pool.size) // 2)

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

    def _overrun_ended(self, task: Task) -> None:
        """A keyed job's handler that overran its timeout has ended (on its thread):
        record the timeout now, which frees its key's slot."""
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
            return
        self._count(outcome)
        self._keyed.pop(task.job.id, None)
        self.waker.wake()
        self.store.wake_workers({task.job.queue})

    def _timeout_for(self, name: str) -> float | None:
        spec = self.registry.get(name)
        if spec is None:
            return None  # unknown here: the executor only snoozes it
        if spec.timeout is not None:
            return spec.timeout
        return self.options.job_timeout.total_seconds()

    def _finished(self, result: Outcome | PendingAck, counted: bool) -> None:
        """A handler returned (on its thread): hand its acknowledgement to the flusher."""
        if isinstance(result, PendingAck):
            self._acks.add(result, counted)
        elif counted:
            self._count(result)

    def _thread_freed(self) -> None:
        """A thread is free: wake the loop once enough are for a claim.

        Not for every one under a backlog: finishing handlers would each cost a claim.
        """
        if self._free() >= self._claim_threshold():
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

    def _unanswered_claims(self) -> list[Job]:
        """The jobs of a claim that raised but committed, which no round adopted before
        the stop: released like the claimed jobs no thread took. A database still
        down leaves them to their leases."""
        adopted: list[Job] = []
        try:
            # Gathered one by one: what an earlier token gave is kept if a later one raises.
            for job in self.runner.adopt_unanswered(self.clock):
                adopted.append(job)
        except SQLAlchemyError as error:
            logger.error(
                "could not look up the jobs of a claim that raised (%s); if it committed, "
                "they return to pending when their leases lapse",
                _brief(error),
            )
        return adopted

    def _shutdown(self) -> None:
        """Let running handlers finish within the grace period; release the rest."""
        # Claimed jobs that no thread took yet go back at once, not after the grace.
        withdrawn = [t.job for t in self.pool.withdraw_queued()] + self._unanswered_claims()
        release(self.store, withdrawn, "claimed but not started", self.clock())
        grace = self.options.shutdown_grace.total_seconds()
        grace_ends = time.monotonic() + grace
        wait_for_handlers(self.pool, grace, self._record_timeouts)
        self.coroutines.wait_idle(grace_ends - time.monotonic())
        # Cancelled before the last flush, so none of them hands in an outcome after it.
        cut_off = self.coroutines.cancel()
        self._acks.stop()
        why = "still running after the shutdown grace period"
        release(self.store, self.pool.in_flight() + cut_off, why, self.clock())
        self._heartbeat.stopped.set()
        self.presence.leave()  # a graceful stop: the row goes
        self.runner.activity.flush()
        self.pool.close()
        self.coroutines.close()
        self.waker.close()


def make_worker(
    store: JobStore,
    executor: Executor,
    config: DeferConfig,
    *,
    concurrency: int | None = None,
    queues: Collection[str] | None = None,
    burst: bool = False,
    clock: Clock | None = None,
    ticker: RecurringTicks | None = None,
    **overrides: Any,
) -> Worker:
    """A :class:`Worker` configured from *config*; *overrides* replace option fields."""
    options = config.worker_options(concurrency=concurrency, queues=queues, burst=burst)
    if overrides:
        options = replace(options, **overrides)
    return Worker(store, executor, options, clock=clock or utcnow, ticker=ticker)


def _waker(store: JobStore, options: WorkerOptions) -> Waker:
    """LISTEN where the driver can (psycopg 3), else a poll every ``poll_interval``."""
    why_not = store.driver.listen_unavailable
    if why_not is not None:
        logger.warning(
            "%s; this worker polls every %g s instead",
            why_not,
            options.poll_interval.total_seconds(),
        )
    if not store.can_listen:
        return Waker(None, queues=options.queues)
    return Waker(store.open_listener, queues=options.queues, probe=store.probe_listener)
