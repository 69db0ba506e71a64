"""The heartbeat that keeps claimed jobs leased while they wait or run.

A claim gives each job a lease (``DEFER_LEASE``); once it lapses, maintenance returns
the job to pending and another process may claim it. Whoever holds claimed jobs must
therefore renew their leases for as long as it holds them, or a handler that outlives
the lease runs twice at once. The worker holds its pool's jobs; ``run_due`` holds the
batch it claimed and runs one by one. Both renew through :class:`LeaseHeartbeat`,
so "no double claims while a lease holds" has one implementation.

No Flask here: the heartbeat only talks to the store.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from types import TracebackType

from sqlalchemy.exc import SQLAlchemyError

from ..jobs import ABORT_CHECK_SECONDS, ABORTS, Job
from ..store import JobStore
from .execution import Clock
from .logs import brief
from .presence import Presence

logger = logging.getLogger("flask_defer.worker")


class LeaseHeartbeat(threading.Thread):
    """Renews the leases of ``in_flight()`` every lease/3 until stopped, and looks for
    abort requests of those jobs every ``ABORT_CHECK_SECONDS``.

    *in_flight* is called from the heartbeat thread and must be thread-safe; it returns
    the claimed jobs whose outcome is not recorded yet. Usable as a context manager:
    started on entry, stopped (and joined) on exit.
    """

    def __init__(
        self,
        store: JobStore,
        lease: timedelta,
        clock: Clock,
        in_flight: Callable[[], Sequence[Job]],
        presence: Presence | None = None,
    ) -> None:
        super().__init__(name="flask-defer-heartbeat", daemon=True)
        self.store = store
        #: This worker's row in the workers table, refreshed with every beat.
        self.presence = presence
        self.lease = lease
        self.clock = clock
        self.in_flight = in_flight
        self.stopped = threading.Event()
        #: Rounds that renewed at least one lease (tests read it).
        self.beats = 0

    def run(self) -> None:
        interval = self.lease.total_seconds() / 3
        tick = min(interval, ABORT_CHECK_SECONDS)
        renew_at = time.monotonic() + interval
        if self.presence is not None:
            self.presence.arrive(self.clock())
        while not self.stopped.wait(tick):
            self.look_for_aborts()
            if time.monotonic() >= renew_at:
                renew_at = time.monotonic() + interval
                self.beat()
                if self.presence is not None:
                    self.presence.beat(self.clock(), [job.id for job in self.in_flight()])

    def look_for_aborts(self) -> int:
        """Note the in-flight runs someone asked to abort (``defer.abort``), so their
        handlers' ``job.abort_requested()`` turns True; how many there are. One read
        by primary key, only while jobs are in flight."""
        jobs = list(self.in_flight())
        if not jobs:
            return 0
        try:
            asked = self.store.aborts_requested(jobs)
        except SQLAlchemyError as error:
            logger.warning("looking for abort requests failed (%s)", brief(error))
            return 0
        for job in asked:
            if not ABORTS.requested(job.id, job.claim_token):
                logger.info("job %d %s: abort requested", job.id, job.name)
            ABORTS.request(job.id, job.claim_token)
        return len(asked)

    def beat(self) -> int:
        """Renew every in-flight lease now; return how many were still ours."""
        jobs = list(self.in_flight())
        if not jobs:
            return 0
        interval = self.lease.total_seconds() / 3
        try:
            now = self.clock()
            renewed = self.store.extend_leases(jobs, now=now, lease_until=now + self.lease)
        except SQLAlchemyError as error:
            logger.warning("heartbeat failed (%s); retrying in %.1f s", brief(error), interval)
            return 0
        self.beats += 1
        if renewed < len(jobs):
            # Finished meanwhile, or reclaimed after a stall longer than the lease
            # (then the handler's late acknowledgement will be refused).
            logger.debug("renewed %d of %d leases", renewed, len(jobs))
        return renewed

    def stop(self) -> None:
        """Stop renewing; waits for a beat under way to finish (when started)."""
        self.stopped.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join()
        if self.presence is not None:
            self.presence.leave()

    def __enter__(self) -> LeaseHeartbeat:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

