"""Reads: jobs, their history, the toasts of an owner, the health report.

Every read joins the caller's transaction (``db.session``), so a page sees its own
uncommitted jobs; the filters of ``list``, ``count`` and the bulk operations are
checked once here (:func:`job_filter`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime
from typing import TypedDict

from ..errors import InvalidArgument
from ..jobs import Job, JobEvent, JobStatus, result_excerpt
from ..store import JobFilter
from ..timeutil import as_utc, utcnow
from ..undo import WAITING_HORIZON, Toast
from ..validation import checked_limit, checked_text, statuses
from . import visibility
from .health import Health
from .state import DeferState


class Filters(TypedDict, total=False):
    """The job filters of ``list``, ``count``, ``retry_many`` and ``cancel_many``."""

    status: JobStatus | str | Iterable[JobStatus | str] | None
    name: str | None
    key_prefix: str | None
    owner: str | None



def job_filter(filters: Filters) -> JobFilter:
    """Validate *filters* (each error names its argument) into the store's filter."""
    unknown = set(filters) - set(Filters.__annotations__)
    if unknown:
        # What Python itself says for a misspelt keyword of an explicit signature.
        raise TypeError(f"got an unexpected keyword argument {sorted(unknown)[0]!r}")
    return JobFilter(
        statuses=statuses(filters.get("status")),
        name=checked_text(filters.get("name"), "name"),
        key_prefix=checked_text(filters.get("key_prefix"), "key_prefix"),
        owner=checked_text(filters.get("owner"), "owner"),
    )



def get(state: DeferState, job_id: int | None = None, key: str | None = None) -> Job | None:
    """The job with this id; for a key, its live job, else the newest settled one."""
    with state.transactions.joined() as conn:
        return state.store.get(conn, job_id=job_id, key=key)


def history(state: DeferState, job_id: int) -> list[JobEvent]:
    """Every recorded state change of *job_id*, oldest first ([] with history off).

    A ``done`` event carries an excerpt of the job's result (read from the job's row,
    where the result is kept: the event stores none).
    """
    with state.transactions.joined() as conn:
        events = state.store.history(conn, job_id)
        if not any(event.event == "done" for event in events):
            return events
        job = state.store.get(conn, job_id=job_id)
    excerpt = result_excerpt(job.result) if job is not None else None
    return [
        replace(event, result_excerpt=excerpt) if event.event == "done" else event
        for event in events
    ]


def find(state: DeferState, filters: Filters, *, limit: int, offset: int) -> list[Job]:
    """Jobs matching *filters*, newest first."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
        raise InvalidArgument("limit", f"expected an integer from 1 to 10000, got {limit!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidArgument("offset", f"expected an integer ≥ 0, got {offset!r}")
    where = job_filter(filters)
    with state.transactions.joined() as conn:
        return state.store.find(conn, where, limit=limit, offset=offset)



def count(state: DeferState, filters: Filters, *, limit: int | None = None) -> int:
    """How many jobs match *filters*; with *limit*, at most that many (a bounded count)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidArgument("limit", f"expected an integer ≥ 1 or None, got {limit!r}")
    where = job_filter(filters)
    with state.transactions.joined() as conn:
        return state.store.count(conn, where, limit=limit)



def toasts(
    state: DeferState,
    owner: str,
    *,
    now: datetime | None,
    limit: int | None,
    waiting: bool = False,
) -> list[Toast]:
    """*owner*'s live Undo toasts, newest first (with ``waiting``, also closed unsettled)."""
    at = as_utc(now, "now") if now is not None else utcnow()
    size = state.config.toast_limit if limit is None else checked_limit(limit)
    with state.transactions.joined() as conn:
        if waiting:
            since = at - WAITING_HORIZON
            jobs = state.store.toast_jobs_for(conn, owner, since=since, limit=size)
        else:
            jobs = state.store.undoable_for(conn, owner, now=at, limit=size)
    return [Toast.from_job(job, at) for job in jobs]



def pending_for(state: DeferState, owner: str, *, limit: int) -> list[Job]:
    """*owner*'s pending jobs, soonest first."""
    with state.transactions.joined() as conn:
        return state.store.pending_for(conn, owner, limit=checked_limit(limit))



def health(state: DeferState, now: datetime | None = None) -> Health:
    """Scheduled vs owed work, the oldest owed job's age, dead letters, lapsed leases."""
    at = as_utc(now, "now") if now is not None else utcnow()
    known = state.registry.names()
    with state.transactions.joined() as conn:
        # One pass over live and failed rows, bounded counts of settled ones.
        parts = state.store.counts_by_name(conn, now=at)
        rate_limited = state.store.full_buckets(conn, now=at)
    late, oldest_late = 0, None
    undeclared: tuple[str, ...] = ()
    # Its own connection: on a schema without the table it answers [] (a failed
    # statement would have aborted the joined transaction on PostgreSQL).
    paused = tuple(pause.label for pause in state.store.paused())
    live = [info for info in visibility.workers(state, at) if not info.stale]
    unserved = visibility.unserved_queues(state, live, at)
    deaf = tuple(info.id for info in live if info.listening is False)
    if state.recurring is not None:
        found = state.recurring.late(at)
        late, oldest_late = found.count, found.oldest_tick
        undeclared = state.recurring.undeclared(at)
    return Health.from_counts(
        parts,
        known_names=known,
        now=at,
        late_schedules=late,
        oldest_late_tick=oldest_late,
        undeclared_schedules=undeclared,
        paused=paused,
        rate_limited=rate_limited,
        unserved_queues=unserved,
        deaf_workers=deaf,
    )
