"""What operators ask the system: who is running (workers), and why a job waits.

``workers`` reads the live workers table (``store.workers``); ``unserved_queues`` is
health's "due jobs, and no live worker serves their queue"; ``explain`` gives every
reason a pending job has not started.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.exc import OperationalError, ProgrammingError

from ..errors import InvalidArgument, JobNotFound
from ..i18n import gettext
from ..jobs import JobStatus
from ..store import ActivityBucket, WorkerInfo
from ..timeutil import as_utc, utcnow
from ..validation import checked_text, identity
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


@dataclass(frozen=True, slots=True)
class Reason:
    """One reason a pending job has not started, as ``defer.explain(id)`` gives it.

    ``code`` is one of ``not_due``, ``queue_paused``, ``name_paused``, ``key_at_limit``,
    ``rate_limited``, ``waiting_for_parents``, ``no_worker``, ``unknown_handler``,
    ``expired``; ``text`` says it in the reader's language. ``until`` is when it ends
    where that is known (``not_due``, ``rate_limited``, ``expired``: when it did),
    ``job_ids`` the jobs involved (the key's holders, the parents waited for), ``actor``
    who paused, ``since`` since when.
    """

    code: str
    text: str
    until: datetime | None = None
    job_ids: tuple[int, ...] = ()
    actor: str | None = None
    since: datetime | None = None


def explain(state: DeferState, job_id: Any, now: datetime | None = None) -> list[Reason]:
    """Every reason the pending job *job_id* has not started ([] for a job that is not
    pending: it runs, or ran). Unknown id: :class:`~flask_defer.JobNotFound`.

    At most five queries: the job, then only what it can be held by (its parents, its
    key's holders or its rate bucket), the pauses, the live workers.
    """
    # Long because: one reason per branch, each with its own words; split, the five
    # queries' budget would be spread over helpers that each need the job.
    checked, _ = identity(job_id, None)
    assert checked is not None
    at = now or utcnow()
    reasons: list[Reason] = []
    store = state.store
    with state.transactions.joined() as conn:
        job = store.get(conn, job_id=checked)
        if job is None:
            raise JobNotFound(job_id=checked)
        if job.status is not JobStatus.PENDING:
            return []
        if job.expires_at is not None and job.expires_at <= at:
            when = job.expires_at.isoformat(timespec="seconds")
            reasons.append(Reason("expired", gettext(
                "It expired at {when} before it started; the next sweep settles it.",
                when=when), until=job.expires_at))  # fmt: skip
        if job.run_at > at:
            when = job.run_at.isoformat(timespec="seconds")
            reasons.append(Reason("not_due", gettext(
                "Not due yet: it runs at {when}.", when=when), until=job.run_at))  # fmt: skip
        if job.waiting_for:
            parents = tuple(store.open_parents(conn, job.id))
            ids = ", ".join(f"#{p}" for p in parents)
            reasons.append(Reason("waiting_for_parents", gettext(
                "It waits for jobs {ids} to settle.", ids=ids), job_ids=parents))  # fmt: skip
        key = job.concurrency_key
        if key is not None and job.rate_limit is not None and job.rate_period is not None:
            frees = store.bucket_frees_at(conn, key, limit=job.rate_limit, now=at)
            if frees is not None:
                reasons.append(Reason("rate_limited", gettext(
                    "Its rate limit of {count} per {seconds:g} s is used up in {bucket} "
                    "until {when}.", count=job.rate_limit, seconds=job.rate_period,
                    bucket=key, when=frees.isoformat(timespec="seconds")),
                    until=frees))  # fmt: skip
        elif key is not None:
            holders = tuple(store.key_holders(conn, key))
            if len(holders) >= (job.concurrency_limit or 1):
                ids = ", ".join(f"#{h}" for h in holders)
                reasons.append(Reason("key_at_limit", gettext(
                    "Its concurrency key {key} is at its limit of {limit}: held by jobs "
                    "{ids}.", key=key, limit=job.concurrency_limit or 1, ids=ids),
                    job_ids=holders))  # fmt: skip
    for pause in store.paused():
        if pause.kind == "queue" and pause.value == job.queue:
            reasons.append(Reason("queue_paused", gettext(
                "Its queue {queue} is paused (by {actor}).", queue=job.queue,
                actor=pause.actor), actor=pause.actor, since=pause.paused_at))  # fmt: skip
        elif pause.kind == "name" and pause.value == job.name:
            reasons.append(Reason("name_paused", gettext(
                "Its job name {name} is paused (by {actor}).", name=job.name,
                actor=pause.actor), actor=pause.actor, since=pause.paused_at))  # fmt: skip
    serving = [w for w in workers(state, at) if not w.stale and w.serves(job.queue)]
    if not serving:
        reasons.append(Reason("no_worker", gettext(
            "No live worker serves its queue {queue}.", queue=job.queue)))  # fmt: skip
    elif not any(job.name in w.names for w in serving):
        reasons.append(Reason("unknown_handler", gettext(
            "No live worker serving its queue has a handler for {name}.",
            name=job.name)))  # fmt: skip
    return reasons


#: What ``defer.activity(bucket=...)`` takes, and the span each reads.
BUCKETS = {"minute": "m", "hour": "h"}


def activity(
    state: DeferState,
    since: datetime | None = None,
    bucket: str = "minute",
    *,
    queue: str | None = None,
    name: str | None = None,
) -> list[ActivityBucket]:
    """Runs started, done, failed and retried per *bucket* (``minute``: kept two hours,
    default the last hour; ``hour``: kept eight days, default the last seven), oldest
    first, for everything or one *queue* or job *name*."""
    if bucket not in BUCKETS:
        raise InvalidArgument("bucket", f"expected 'minute' or 'hour', got {bucket!r}")
    now = utcnow()
    if since is None:
        since = now - (timedelta(hours=1) if bucket == "minute" else timedelta(days=7))
    start = as_utc(since, "since")
    return state.store.activity(
        since=start, span=BUCKETS[bucket], queue=checked_text(queue, "queue"),
        name=checked_text(name, "name"),
    )  # fmt: skip


def activity_keys(state: DeferState, since: datetime) -> tuple[list[str], list[str]]:
    """The queues and job names with activity since *since* (the Activity page's filters)."""
    return state.store.activity_keys(since=since)
