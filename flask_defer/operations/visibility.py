"""What operators ask the system: who is running (workers), and why a job waits.

``workers`` reads the live workers table (``store.workers``); ``unserved_queues`` is
health's "due jobs, and no live worker serves their queue".
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.exc import OperationalError, ProgrammingError

from ..store import WorkerInfo
from ..timeutil import utcnow
from .state import DeferState

#: At most this many queues with due jobs are looked at for "nobody serves it".
DUE_QUEUES_WINDOW = 1000


def workers(state: DeferState, now: datetime | None = None) -> list[WorkerInfo]:
    """Every worker's row (and every ``run_due`` holding jobs), live ones first; [] on a
    schema from before the workers table (``flask defer db upgrade`` adds it)."""
    try:
        return state.store.workers(now=now or utcnow())
    except (OperationalError, ProgrammingError):
        return []


def unserved_queues(state: DeferState, live: list[WorkerInfo], now: datetime) -> tuple[str, ...]:
    """Queues with due jobs that no live worker claims from (empty when one serves
    every queue). A cron ``run_due`` between its runs counts as no worker: its jobs are
    late until the next run, which this says."""
    if any(not info.queues for info in live):
        return ()
    served = {queue for info in live for queue in info.queues}
    with state.transactions.joined() as conn:
        counts, _ = state.store.queue_counts(conn, now=now, cap=DUE_QUEUES_WINDOW)
    return tuple(sorted(c.queue for c in counts if c.due and c.queue not in served))
