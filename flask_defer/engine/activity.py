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
from datetime import datetime

from sqlalchemy.exc import SQLAlchemyError

from ..jobs import Job
from ..store import JobStore
from ..store.activity import LATENESS_BOUNDS, ActivityRow
from .outcomes import Outcome

logger = logging.getLogger("flask_defer.worker")

#: Seconds between two writes of the counts.
FLUSH_SECONDS = 5.0

#: Which count each outcome adds to (besides ``started``, which every run adds to).
_COUNTED = {Outcome.DONE: "done", Outcome.FAILED: "failed", Outcome.RETRIED: "retried"}


class ActivityCounter:
    """Counts per (minute, queue, name), kept in memory until :meth:`flush`."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._counts: dict[tuple[datetime, str, str], ActivityRow] = {}
        self._next_flush = time.monotonic() + FLUSH_SECONDS

    def record(self, job: Job, outcome: Outcome) -> None:
        """Count one run of *job* that ended in *outcome* (a lost claim is not counted:
        the worker that took the job over counts it)."""
        if outcome is Outcome.LOST:
            return
        claimed = job.updated_at or job.run_at
        minute = claimed.replace(second=0, microsecond=0)
        late = max((claimed - job.due_at).total_seconds(), 0.0)
        slot = next(i for i, bound in enumerate(LATENESS_BOUNDS) if late <= bound)
        key = (minute, job.queue, job.name)
        with self._lock:
            row = self._counts.get(key)
            if row is None:
                row = self._counts[key] = ActivityRow(minute, job.queue, job.name)
            row.started += 1
            row.lateness[slot] += 1
            kind = _COUNTED.get(outcome)
            if kind == "done":
                row.done += 1
            elif kind == "failed":
                row.failed += 1
            elif kind == "retried":
                row.retried += 1

    def flush_if_due(self) -> None:
        """Write the counts when :data:`FLUSH_SECONDS` have passed since the last write."""
        if time.monotonic() >= self._next_flush:
            self.flush()

    def flush(self) -> None:
        """Write the counts now (one upsert); on a database error keep them for the next
        flush, so a blip loses nothing."""
        self._next_flush = time.monotonic() + FLUSH_SECONDS
        with self._lock:
            rows, self._counts = list(self._counts.values()), {}
        if not rows:
            return
        try:
            self.store.record_activity(rows)
        except SQLAlchemyError as error:
            first = str(getattr(error, "orig", None) or error).strip().splitlines()
            logger.warning("could not write the activity counts (%s); kept for the next "
                           "flush", first[0] if first else type(error).__name__)  # fmt: skip
            with self._lock:
                for row in rows:
                    key = (row.start, row.queue, row.name)
                    kept = self._counts.get(key)
                    self._counts[key] = row if kept is None else kept.plus(row)
