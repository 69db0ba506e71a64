"""Housekeeping that one worker at a time does: reclaim lapsed leases, prune old jobs.

On the reclaim round the worker also settles jobs past their ``expires_at`` as expired
(:func:`expire_due`); the claim never starts them meanwhile. And it releases children
left waiting behind a settled parent (``JobStore.release_stranded``: a worker died
between a PostgreSQL acknowledgement and its release).

*Reclaim* returns the jobs of crashed workers to pending once their lease lapsed, so
they run again within about a lease (not after a fixed quarter of an hour). *Prune*
deletes settled rows past their retention, with their history events, in bounded
batches so a worker catching up on a large backlog goes back to claiming jobs between.

Both are guarded statements, so two workers doing them at once would be merely
wasteful; on PostgreSQL an advisory lock (``JobStore.maintenance_lock``) makes one
worker do them while the others skip the round. ``run_due`` (a cron run, perhaps with
no worker anywhere) reclaims with :func:`reclaim_lapsed` before it claims: the same
step under the same lock.
"""

from __future__ import annotations

import logging
import time

from .. import signals
from ..config import MaintenancePolicy
from ..jobs import Job
from ..store import JobStore
from .execution import Clock, Emit

logger = logging.getLogger("flask_defer.worker")

#: How often the claim loop settles expired jobs (see ``Maintenance.expire_if_due``).
EXPIRY_CHECK_SECONDS = 0.5
#: Batches deleted per round; a round that hits it prunes again soon after.
PRUNE_BATCHES_PER_ROUND = 10
PRUNE_BATCH_SIZE = 1000
#: Settled parents whose stranded children one statement releases.
STRANDED_BATCH = 500


def prune(store: JobStore, policy: MaintenancePolicy, clock: Clock, **limits: int) -> int:
    """Delete settled rows older than the retention; return how many went.

    Its callers release stranded children first (:func:`release_stranded`): a parent's
    open edges outlive it, but the release reads its row.
    """
    now = clock()
    return store.prune(
        settled_before=now - policy.retention,
        failed_before=now - policy.failed_retention,
        **limits,
    )


def release_stranded(store: JobStore, clock: Clock, *, actor: str = "app") -> int:
    """Release the children of settled parents whose release never ran; how many parents.

    On PostgreSQL an acknowledgement and its children's release are two transactions:
    a process killed between them (a worker, or ``run_due`` from cron) leaves the
    children waiting. The worker's maintenance round, ``run_due`` and ``prune`` call
    this; it looks first, so the usual call takes no write lock.
    """
    released = 0
    while True:
        parents = store.release_stranded(now=clock(), actor=actor, limit=STRANDED_BATCH)
        released += parents
        if parents < STRANDED_BATCH:
            break
    if released:
        logger.warning(
            "released the children of %d settled job(s) whose process stopped "
            "between their acknowledgement and the release",
            released,
        )
    return released


def reclaim_lapsed(store: JobStore, clock: Clock, *, actor: str = "app") -> int | None:
    """Reclaim lapsed leases now, under the maintenance lock; how many jobs came back.

    None when another process holds the lock: it is reclaiming (or pruning) at this
    moment, and a second reclaim would find nothing more. Looks first, so a call with
    nothing to reclaim (the usual case) takes neither the lock nor a write lock.
    *actor* is who the history says reclaimed the jobs.
    """
    if not store.any_lapsed(now=clock()):
        return 0
    with store.maintenance_lock() as mine:
        return _reclaim(store, clock, actor) if mine else None


def expire_due(
    store: JobStore, clock: Clock, *, actor: str = "app", emit: Emit | None = None
) -> int:
    """Settle the pending jobs past their ``expires_at`` as expired; how many.

    A guarded statement (``status = 'pending'``), so workers doing it side by side
    settle each job once; it needs no maintenance lock. With *emit*, each settled job
    is announced as ``job_expired`` once committed.
    """

    def announce(jobs: list[Job]) -> None:
        for job in jobs:
            if emit is not None:
                emit(signals.job_expired, job=job)

    expired = store.expire_due(now=clock(), actor=actor, on_expired=announce)
    if expired:
        logger.info("%d job(s) expired before they started (expires_at passed)", expired)
    return expired


def _reclaim(store: JobStore, clock: Clock, actor: str = "app") -> int:
    returned, failed = store.reclaim_lapsed(now=clock(), actor=actor)
    if returned or failed:
        logger.warning(
            "reclaimed jobs with lapsed leases: %d back to pending, %d failed "
            "(out of attempts)",
            returned,
            failed,
        )
    return returned + failed


class Maintenance:
    """Runs reclaim and prune when they are due; the worker calls it every loop."""

    def __init__(
        self,
        store: JobStore,
        policy: MaintenancePolicy,
        clock: Clock,
        *,
        actor: str = "app",
        emit: Emit | None = None,
    ) -> None:
        self.store = store
        self.emit = emit
        #: Who the history says reclaimed a lapsed job (the worker doing maintenance).
        self.actor = actor
        self.policy = policy
        self.clock = clock
        # Both are due at start: a restarted worker should pick up the jobs its
        # crashed predecessor held as soon as their leases allow.
        self._next_reclaim = 0.0
        self._next_prune = 0.0
        self._next_expiry = 0.0
        self._expiry_at: float | None = None
        self.reclaimed = 0
        self.pruned = 0
        #: Jobs this worker's sweeps settled as expired (on the reclaim round).
        self.expired = 0

    def next_due(self) -> float:
        """The monotonic time of the next round."""
        return min(self._next_reclaim, self._next_prune)

    def expire_if_due(self) -> None:
        """Settle jobs past their ``expires_at`` now, at most every
        :data:`EXPIRY_CHECK_SECONDS`: the claim loop calls this, so an expired job is
        settled within a fraction of a second rather than at the next reclaim round
        (one read of the partial expiry index when none is due, no lock)."""
        now = time.monotonic()
        if now < self._next_expiry:
            return
        self.expired += expire_due(self.store, self.clock, actor=self.actor, emit=self.emit)
        # The next look: in half a second, or when the next pending job expires if that
        # is later (a sleeping worker wakes for it: see next_expiry_due).
        wall = self.clock()
        upcoming = self.store.next_expiry(now=wall)
        self._next_expiry = now + EXPIRY_CHECK_SECONDS
        self._expiry_at = (
            None if upcoming is None
            else max(now + (upcoming - wall).total_seconds(), self._next_expiry)
        )  # fmt: skip

    def look_again_for_expiry(self) -> None:
        """A job was added elsewhere (a NOTIFY woke the worker): it may carry an
        ``expires_at`` sooner than any this worker knows of, so look again once
        :meth:`expire_if_due` may (within :data:`EXPIRY_CHECK_SECONDS`), instead of at
        the next maintenance round or ``DEFER_MAX_SLEEP``."""
        due = self._next_expiry
        self._expiry_at = due if self._expiry_at is None else min(self._expiry_at, due)

    def next_expiry_due(self) -> float | None:
        """The monotonic time a sleeping worker must wake to settle the next expiring
        job (None: no pending job has an ``expires_at``)."""
        return self._expiry_at

    def run_if_due(self) -> None:
        """Reclaim and/or prune if their time has come and this worker holds the lock."""
        now = time.monotonic()
        reclaim_due = now >= self._next_reclaim
        prune_due = now >= self._next_prune
        if not (reclaim_due or prune_due):
            return
        # Move the schedule first: a database error below must not make every loop
        # iteration retry maintenance.
        if reclaim_due:
            self._next_reclaim = now + self.policy.reclaim_interval.total_seconds()
        if prune_due:
            self._next_prune = now + self.policy.prune_interval.total_seconds()
        with self.store.maintenance_lock() as mine:
            if not mine:
                return
            if reclaim_due:
                self.reclaimed += _reclaim(self.store, self.clock, self.actor)
                self.expired += expire_due(
                    self.store, self.clock, actor=self.actor, emit=self.emit
                )
                self.store.forget_old_starts(now=self.clock())
                self.store.forget_workers(now=self.clock())
                self.store.forget_old_activity(now=self.clock())
            # Once per round, and before a prune: see prune().
            release_stranded(self.store, self.clock, actor=self.actor)
            if prune_due:
                self._prune(now)

    def _prune(self, now: float) -> None:
        deleted = prune(
            self.store,
            self.policy,
            self.clock,
            batch_size=PRUNE_BATCH_SIZE,
            max_batches=PRUNE_BATCHES_PER_ROUND,
        )
        self.pruned += deleted
        if deleted:
            logger.info("pruned %d settled job(s) past their retention", deleted)
        if deleted >= PRUNE_BATCH_SIZE * PRUNE_BATCHES_PER_ROUND:
            self._next_prune = now + 1.0  # more to do: continue after a breath
