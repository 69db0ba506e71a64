"""The one claim → execute → acknowledge path, used by ``run_due`` and the worker alike.

A claim takes a batch of due jobs with one guarded statement and gives each a lease
under a fresh token; the executor runs a job's handler and acknowledges the outcome
with compare-and-set on that token. :func:`claim_due` is the only place a claim is
built, so a fix to how jobs are claimed (their order, a paused-queue filter, claim
batching) is made once and seen by ``defer.run_due`` and ``flask defer worker``
both; :meth:`Runner.execute` is the only place a claimed job is handed to the
executor, so acknowledgement has one home too.

No Flask here: the executor carries the app-context factory it was handed.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Collection, Iterator, Sequence
from datetime import datetime, timedelta

from sqlalchemy.exc import SQLAlchemyError

from ..jobs import Job
from ..store import JobStore
from ..timeutil import utcnow
from .activity import ActivityCounter
from .execution import Clock, Executor, Outcome, PendingAck, RunSummary
from .leases import LeaseHeartbeat
from .logs import brief
from .outcomes import DROPPED, written_alone
from .presence import Presence

logger = logging.getLogger("flask_defer.worker")


def claim_due(
    store: JobStore,
    *,
    now: datetime,
    limit: int,
    lease: timedelta,
    queues: Collection[str] | None = None,
    actor: str = "app",
    look_first: bool = True,
    token: str | None = None,
) -> list[Job]:
    """Claim up to *limit* jobs due at *now* under *token* (a fresh one by default),
    leased for *lease*.

    The claim counts each job's attempt: claim only jobs that start now.
    """
    return store.claim(
        now=now,
        limit=limit,
        token=token or uuid.uuid4().hex,
        lease_until=now + lease,
        queues=queues,
        actor=actor,
        look_first=look_first,
    )


class Runner:
    """Claims due jobs and runs them through one executor.

    *actor* is who the history says claimed and acknowledged the jobs: the worker
    (``worker:<host>:<pid>``), or ``app`` for ``run_due``.
    """

    def __init__(
        self,
        store: JobStore,
        executor: Executor,
        *,
        lease: timedelta,
        claim_batch: int,
        actor: str = "app",
        adopts: bool = False,
    ) -> None:
        self.store = store
        self.executor = executor
        self.lease = lease
        self.claim_batch = claim_batch
        self.actor = actor
        #: What this runner ran, per minute, queue and name: written every few seconds.
        self.activity = ActivityCounter(store)
        #: With *adopts* (a worker's own runner): tokens of claims that raised, which may
        #: have committed all the same. Not for ``run_due``'s runner, which lives as long
        #: as the app and has no next round to adopt them in.
        self._adopts = adopts
        self._unanswered: list[str] = []

    def claim(
        self,
        now: datetime,
        limit: int,
        *,
        queues: Collection[str] | None = None,
        look_first: bool = True,
    ) -> list[Job]:
        """Claim at most ``min(limit, claim_batch)`` due jobs (see :func:`claim_due`).

        With *adopts*, a claim that raises is remembered by its token:
        :meth:`adopt_unanswered` gives back what it took if it committed all the same.
        """
        token = uuid.uuid4().hex
        try:
            return claim_due(
                self.store,
                now=now,
                limit=min(limit, self.claim_batch),
                lease=self.lease,
                queues=queues,
                actor=self.actor,
                look_first=look_first,
                token=token,
            )
        except SQLAlchemyError:
            if self._adopts:
                self._unanswered.append(token)
            raise

    def adopt_unanswered(self, clock: Clock) -> Iterator[Job]:
        """The jobs of this runner's claims that raised but committed, leased anew.

        A claim whose reply the database never sent (it went away after the commit)
        leaves its jobs running with their attempt counted and no handler: "attempts
        count handler starts" would not hold, and they would wait a lease. The caller
        starts what this yields, before anything reclaims lapsed leases (or, stopping,
        releases it with the attempt given back). A token is forgotten once looked up;
        if the look raises, it is kept for the next call, and what earlier tokens gave
        was yielded already.
        """
        while self._unanswered:  # the clock is read only then: this runs every round
            now = clock()
            try:
                jobs = self.store.adopt_claim(
                    self._unanswered[0], now=now, lease_until=now + self.lease
                )
            except (ValueError, TypeError) as error:
                # A row that cannot be read (SQLite text spoilt by hand): the adoption
                # rolled back, and would fail the same way every round. Those jobs come
                # back when their leases lapse, and the unreadable one is failed then.
                logger.error(
                    "could not adopt the jobs of a claim that raised (%s); they run "
                    "again when their leases lapse", error,
                )  # fmt: skip
                jobs = []
            self._unanswered.pop(0)
            if jobs:
                logger.warning(
                    "a claim raised after it committed: %d job(s) adopted by its token",
                    len(jobs),
                )
                if any(job.concurrency_key is not None for job in jobs):
                    self.store.keyed_scheduled()  # as the claim would have said
            yield from jobs

    def execute(self, job: Job, clock: Clock, *, batch: bool = False) -> Outcome | PendingAck:
        """Run one claimed job's handler; acknowledge its outcome now, or with ``batch``
        hand back the acknowledgement for :meth:`flush` to write with others."""
        result = self.executor.execute(job, clock, batch=batch, actor=self.actor)
        if isinstance(result, Outcome):
            self.activity.record(job, result)
        return result

    def flush(
        self,
        pending: Sequence[PendingAck],
        clock: Clock,
        *,
        tried: Collection[tuple[int, str]] = (),
    ) -> list[Outcome]:
        """Write batched acknowledgements in one statement; their outcomes, in order.

        The one place batched outcomes are written, for ``run_due`` and the worker.
        *tried*: see ``Executor.flush``.
        """
        outcomes = self.executor.flush(pending, clock, actor=self.actor, tried=tried)
        for done, outcome in zip(pending, outcomes, strict=True):
            if done.job is not None:
                self.activity.record(done.job, outcome)
        return outcomes

    def _write_batch(self, pending: Sequence[PendingAck], clock: Clock) -> list[Outcome]:
        """``run_due``'s write of a claimed batch's outcomes: one statement, or, when the
        database refuses that for a value in it, each outcome on its own, as the
        worker's flusher does. A result past the size limit then fails its job
        (``PendingAck.instead``); any other outcome refused on its own is dropped,
        logged, and its job runs again after its lease. Any other error raises.
        """
        try:
            return self.flush(pending, clock)
        except SQLAlchemyError as error:
            if not self.store.refuses_values(error):
                raise
            refused = error
        # Part of the batch may be written all the same (on PostgreSQL, a refusal after
        # the batch statement), so each write asks whether the first one wrote it.
        tried = {(p.ack.job_id, p.ack.claim_token) for p in pending}
        logger.warning(
            "the database refused a batch of %d outcomes (%s); writing them one by one",
            len(pending), brief(refused),
        )  # fmt: skip
        outcomes: list[Outcome] = []
        for one in pending:
            try:
                outcome, _ = written_alone(lambda p: self.flush([p], clock, tried=tried)[0], one)
            except SQLAlchemyError as error:
                if not self.store.refuses_values(error):
                    raise
                logger.error(DROPPED, one.ack.job_id, brief(error))
                continue
            outcomes.append(outcome)
        return outcomes

    def run_due(
        self, clock: Clock, *, limit: int | None = None, deadline: float | None = None
    ) -> RunSummary:
        """Claim and run, in this thread, every job due by *clock* (at most *limit*).

        The claimed batch stays leased while it waits and runs: the worker's heartbeat
        renews it, so a worker beside this call never takes a job over while its lease
        holds, however long a handler takes. With *deadline* (a ``time.monotonic()``
        value) no job starts after it: the rest of the batch goes back to pending
        untouched and ``summary.out_of_time`` is set.
        """
        # Long on purpose: the held list is shared by the heartbeat, the claim loop and the
        # finally that hands unstarted jobs back; split, that sharing would need an object
        # of its own for one loop.
        summary = RunSummary()
        started: set[int] = set()
        held: list[Job] = []  # claimed by this call, outcome not written yet
        lock = threading.Lock()

        def in_flight() -> list[Job]:
            with lock:
                return list(held)

        # Leases are judged by the wall clock: an injected *now* in the past must not
        # renew them into the past.
        presence = Presence(
            self.store, kind="run_due", queues=None, concurrency=1,
            heartbeat_seconds=self.lease.total_seconds() / 3,
            names=self.executor.registry.names(), at_first_beat=True,
        )  # fmt: skip
        heartbeat = LeaseHeartbeat(
            self.store, self.lease, lambda: max(clock(), utcnow()), in_flight, presence=presence
        )
        try:
            # The limit counts handlers started: an outcome the database refused is not
            # in the summary, and its job must not make room for another.
            while limit is None or len(started) < limit:
                if deadline is not None and time.monotonic() >= deadline:
                    summary.out_of_time = True
                    break
                batch = self.claim_batch if limit is None else limit - len(started)
                jobs = self.claim(clock(), batch)
                # Each job runs at most once per call: a handler that reschedules itself
                # before the injected *now* (say, by wall-clock time) must not loop forever.
                again = [job for job in jobs if job.id in started]
                if again:
                    self.store.release(again, now=clock(), keep_run_at=True)
                fresh = [job for job in jobs if job.id not in started]
                if not fresh:
                    break
                with lock:
                    held[:] = fresh
                if heartbeat.ident is None:
                    heartbeat.start()  # only once something is held: most calls hold nothing
                # Outcomes are written per claimed batch, in one statement (see flush);
                # until then the finished jobs stay held, their leases renewed.
                pending: list[PendingAck] = []
                try:
                    for job in fresh:
                        if deadline is not None and time.monotonic() >= deadline:
                            summary.out_of_time = True
                            break  # the rest is handed back below
                        started.add(job.id)
                        result = self.execute(job, clock, batch=True)
                        if isinstance(result, PendingAck):
                            pending.append(result)
                        else:
                            summary.add(result)
                finally:
                    for outcome in self._write_batch(pending, clock):
                        summary.add(outcome)
                with lock:
                    held[:] = [job for job in held if job.id not in started]
                if summary.out_of_time:
                    break
        finally:
            heartbeat.stop()
            self._hand_back([job for job in held if job.id not in started], clock)
            self.activity.flush()
        return summary

    def _hand_back(self, jobs: list[Job], clock: Clock) -> None:
        """Return claimed jobs that never started to pending, due as before."""
        if not jobs:
            return
        try:
            self.store.release(jobs, now=clock(), keep_run_at=True)
        except SQLAlchemyError as error:
            # Not raised: it would hide the error that stopped the run, if any.
            logger.warning(
                "could not hand back %d claimed job(s) (%s); they return to pending "
                "when their leases lapse",
                len(jobs),
                brief(error),
            )
