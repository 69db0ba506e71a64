"""What a worker ran, per minute, queue and job name: the counts the Activity charts show.

Each outcome is counted in memory as it is acknowledged (:meth:`ActivityCounter.
record`, called by the runner for every outcome, batched or not); the counts go to
the database every :data:`FLUSH_SECONDS` in one upsert (:meth:`ActivityCounter.
flush`), not with each acknowledgement, so the drain pays a dictionary update per job
and one statement every few seconds. A worker killed outright loses at most those
seconds of counts; its jobs' rows and history are not affected.

Lateness (claim time minus ``due_at``) is counted in :data:`LATENESS_BOUNDS` buckets,
enough for p50 and p95 without keeping every value.
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_left
from datetime import UTC, datetime

from sqlalchemy.exc import SQLAlchemyError

from ..jobs import Job
from ..store import JobStore
from ..store.activity import LATENESS_BOUNDS, ActivityRow
from .logs import brief
from .outcomes import Outcome

logger = logging.getLogger("flask_defer.worker")

#: Seconds between two writes of the counts.
FLUSH_SECONDS = 5.0

#: Which count each outcome adds to, by its index in a key's counts (``started`` is 0,
#: which every run adds to; the lateness histogram follows at ``_LATE``).
_COUNTED = {Outcome.DONE: 1, Outcome.FAILED: 2, Outcome.RETRIED: 3}
_LATE = 4


class ActivityCounter:
    """Counts per (minute, queue, name), kept in memory until :meth:`flush`.

    The handler threads call :meth:`record` for every run, so it is kept to a few
    arithmetic steps (profiled: 2.3 µs a job with datetimes for keys, about a third of
    that with the minute as an integer).
    """

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        # (minute since the epoch, queue, name) -> [started, done, failed, retried,
        # then the lateness histogram]
        self._counts: dict[tuple[int, str, str], list[int]] = {}
        self._next_flush = time.monotonic() + FLUSH_SECONDS

    def record(self, job: Job, outcome: Outcome) -> None:
        """Count one run of *job* that ended in *outcome* (a lost claim is not counted:
        the worker that took the job over counts it)."""
        if outcome is Outcome.LOST:
            return
        claimed = (job.updated_at or job.run_at).timestamp()
        slot = bisect_left(LATENESS_BOUNDS, claimed - job.due_at.timestamp())
        key = (int(claimed // 60), job.queue, job.name)
        kind = _COUNTED.get(outcome)
        with self._lock:
            counts = self._counts.get(key)
            if counts is None:
                counts = self._counts[key] = [0] * (_LATE + len(LATENESS_BOUNDS))
            counts[0] += 1
            counts[_LATE + slot] += 1
            if kind is not None:
                counts[kind] += 1

    def flush_if_due(self) -> None:
        """Write the counts when :data:`FLUSH_SECONDS` have passed since the last write."""
        if time.monotonic() >= self._next_flush:
            self.flush()

    def flush(self) -> None:
        """Write the counts now (one upsert); on a database error keep them for the next
        flush, so a blip loses nothing."""
        self._next_flush = time.monotonic() + FLUSH_SECONDS
        with self._lock:
            taken, self._counts = self._counts, {}
        if not taken:
            return
        rows = [
            ActivityRow(
                datetime.fromtimestamp(minute * 60, UTC), queue, name, started=counts[0],
                done=counts[1], failed=counts[2], retried=counts[3], lateness=counts[_LATE:],
            )  # fmt: skip
            for (minute, queue, name), counts in taken.items()
        ]
        try:
            self.store.record_activity(rows)
        except SQLAlchemyError as error:
            logger.warning(
                "could not write the activity counts (%s); kept for the next flush", brief(error)
            )
            with self._lock:
                for key, counts in taken.items():
                    kept = self._counts.get(key)
                    if kept is not None:
                        counts = [a + b for a, b in zip(kept, counts, strict=True)]
                    self._counts[key] = counts
