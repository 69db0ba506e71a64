"""What the facade's control, Undo and read methods do, over one app's state.

``Defer``'s public methods validate nothing themselves and call these functions with
the current app's :class:`~flask_defer.operations.state.DeferState`, so the rules live here once:
which transaction each operation uses (joined for reads and inserts, its own for
anything that decides a race) and what a refused guarded change means.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, TypedDict

from ..engine.execution import Clock
from ..engine.worker import Worker
from ..errors import InvalidArgument, JobNotFound, JobNotPending
from ..jobs import Job, JobStatus
from ..queue_controls import checked_priority, checked_ttl
from ..store import JobFilter
from ..timeutil import Duration, as_duration, as_utc, resolve_run_at, utcnow
from ..undo import MAX_JOB_ID, WAITING_HORIZON, Toast
from ..validation import (
    DEFAULT_ACTOR,
    checked_commit,
    checked_limit,
    checked_text,
    identity,
    statuses,
)
from .bulk import build_new_jobs
from .state import DeferState


class Filters(TypedDict, total=False):
    """The job filters of ``list``, ``count``, ``retry_many`` and ``cancel_many``."""

    status: JobStatus | str | Iterable[JobStatus | str] | None
    name: str | None
    key_prefix: str | None
    owner: str | None


#: The longest window one hold may ask for (``DEFER_UNDO_MAX_HOLD`` bounds the total).
MAX_HOLD_REQUEST = timedelta(hours=1)


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


def schedule_many(
    state: DeferState,
    name: str,
    payloads: Iterable[Any],
    *,
    run_at: datetime | None,
    delay: Duration | None,
    owner: str | None,
    label: str | None,
    priority: int | None = None,
    ttl: Duration | None = None,
) -> int:
    """Validate every item, then insert them in one batch joining the caller's transaction."""
    spec = state.spec_for(name)
    level = spec.priority if priority is None else checked_priority(priority)
    span = checked_ttl(ttl) if ttl is not None else spec.ttl
    now = utcnow()
    jobs = build_new_jobs(
        payloads,
        name=name,
        queue=spec.queue,
        max_attempts=state.max_attempts(spec),
        now=now,
        run_at=run_at,
        delay=delay,
        owner=owner,
        label=label,
        max_payload_bytes=state.config.max_payload_bytes,
        strict_local_times=state.config.strict_local_times,
        priority=level,
        ttl=span,
    )
    if not jobs:
        return 0
    with state.transactions.joined(writes=True) as conn:
        return state.store.insert_many(conn, jobs, now=now)


def undoable(
    state: DeferState,
    name: str,
    payload: Any,
    *,
    window: Duration | None,
    label: str | None,
    key: str | None,
    owner: str | None,
    replace: bool,
    texts: dict[str, str | None] | None = None,
) -> Job:
    """Schedule *name* after an Undo window (plus the margin), with a toast for *owner*.

    *texts* are the toast's state texts (``waiting_label``, ``done_label``, ...), each
    stored in its own column.
    """
    span = (
        state.config.undo_window
        if window is None
        else as_duration(window, "window", allow_zero=False)
    )
    if owner is None:
        raise InvalidArgument(
            "owner",
            "there is no current owner to show the Undo toast to; call undoable() "
            "while handling a request, or pass owner=",
        )
    now = utcnow()
    return state.schedule(
        name,
        payload,
        run_at=now + span + state.config.undo_margin,
        key=key,
        replace=replace,
        owner=owner,
        label=label,
        undo_until=now + span,
        texts=texts,
    )


def hold(state: DeferState, job_id: Any, seconds: Duration, owner: str | None) -> Job:
    """Keep an open Undo window open *seconds* more (see :meth:`Defer.hold`)."""
    checked_id, _ = identity(job_id, None)
    assert checked_id is not None
    if not 1 <= checked_id <= MAX_JOB_ID:
        raise JobNotFound(checked_id)
    checked_owner = checked_text(owner, "owner")
    span = as_duration(seconds, "seconds", allow_zero=False)
    if span > MAX_HOLD_REQUEST:
        raise InvalidArgument("seconds", f"at most {MAX_HOLD_REQUEST}, got {span}")
    config = state.config
    now = utcnow()
    with state.transactions.own("hold") as conn:
        moved = state.store.hold(
            conn,
            checked_id,
            owner=checked_owner,
            undo_until=now + span,
            margin=config.undo_margin,
            max_hold=config.undo_max_hold,
            now=now,
            actor=checked_owner or "app",
        )
        if moved is not None:
            return moved
        existing = state.refused(conn, checked_id, None, checked_owner)
        if existing.undo_seconds_left(now) <= 0:
            raise JobNotPending(existing.id, existing.status.value)
        return existing  # already later than asked, or at the cap


def worker(
    state: DeferState,
    *,
    concurrency: int | None,
    queues: Iterable[str] | None,
    burst: bool,
    clock: Clock | None,
) -> Worker:
    """A worker for *state*'s app, its command-line style arguments checked."""
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    ):
        raise InvalidArgument("concurrency", f"expected an integer ≥ 1, got {concurrency!r}")
    names: list[str] | None = None
    if queues is not None:
        if isinstance(queues, str):
            raise InvalidArgument("queues", "expected a list of queue names, not one string")
        names = [checked_text(q, "queues") or "" for q in queues] or None
    return state.worker(concurrency=concurrency, queues=names, burst=bool(burst), clock=clock)


def reschedule(
    state: DeferState,
    job_id: Any,
    key: Any,
    run_at: datetime | None,
    delay: Duration | None,
    actor: str = DEFAULT_ACTOR,
    *,
    commit: bool = True,
    operation: str = "reschedule",
    event: str = "rescheduled",
) -> Job:
    """Move a pending job; :class:`JobNotPending` / :class:`JobNotFound` otherwise.

    ``operation`` names the public call in errors (``run_now`` comes this way too);
    *event* is what the history calls it: ``rescheduled``, or ``run_now``.
    """
    if run_at is None and delay is None:
        raise InvalidArgument("run_at", "give run_at or delay to reschedule to")
    job_id, key = identity(job_id, key)
    commit = checked_commit(commit)
    now = utcnow()
    when = resolve_run_at(run_at, delay, now, strict=state.config.strict_local_times)
    with state.transactions.control(operation, commit=commit) as conn:
        moved = state.store.reschedule(
            conn, when, now=now, job_id=job_id, key=key, actor=actor, event=event
        )
        if moved is None:
            existing = state.refused(conn, job_id, key)
            raise JobNotPending(existing.id, existing.status.value)
    return moved


def retry(
    state: DeferState, job_id: Any, actor: str = DEFAULT_ACTOR, *, commit: bool = True
) -> Job:
    """failed → pending, due now, attempts reset; :class:`JobNotPending` otherwise."""
    checked, _ = identity(job_id, None)
    assert checked is not None
    commit = checked_commit(commit)
    # No uncommitted-jobs check here: 0.1.0 never made one for retry().
    with state.transactions.control("retry", commit=commit, guard=False) as conn:
        job = state.store.retry_failed(conn, checked, now=utcnow(), actor=actor)
        if job is None:
            existing = state.refused(conn, checked, None)
            raise JobNotPending(existing.id, existing.status.value)
    return job


def retry_many(state: DeferState, filters: Filters, actor: str = DEFAULT_ACTOR) -> int:
    """Put every matching failed job back to pending, due now; how many."""
    where = job_filter(filters)
    with state.transactions.own("retry_many") as conn:
        return state.store.retry_failed_many(conn, where, now=utcnow(), actor=actor)


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
