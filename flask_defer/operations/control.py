"""Control: cancel, undo, hold, reschedule and retry, over one app's state.

Each is one guarded statement in the transaction the call decides on (its own, or
the caller's with ``commit=False``); a refused change is read afterwards only to say
why (:func:`refused`), never before: the write decides, the read explains.

Every cancel is one guarded statement. Those that run the ``on_undo`` hooks (the
owner's Undo and an operator's cancel) share one path, :func:`cancel_with_hooks`, so
the hooks, the transaction and the history's wording are the same whoever stops the
job; the app's own cancel (no actor) runs the statement alone.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from .. import signals
from ..errors import InvalidArgument, JobNotFound, JobNotPending
from ..jobs import Job, JobStatus
from ..timeutil import Duration, as_duration, resolve_run_at, utcnow
from ..undo import MAX_JOB_ID, UndoOutcome
from ..validation import DEFAULT_ACTOR, checked_commit, checked_text, identity
from .reads import Filters, job_filter
from .state import DeferState


def is_operator(actor: str) -> bool:
    """True for a cancel made by an operator: any explicit actor but the app itself.

    The dashboard passes the signed-in operator (or ``dashboard``), ``flask defer
    cancel`` passes ``cli``; a Python call without ``actor=`` is the app's own code
    (``app``), which does its own bookkeeping and runs no hooks.
    """
    return actor != DEFAULT_ACTOR


def cancel(
    state: DeferState,
    job_id: Any,
    key: Any,
    owner: str | None,
    actor: str = DEFAULT_ACTOR,
    *,
    commit: bool = True,
) -> bool:
    """pending → cancelled and True; anything else unchanged and False; unknown raises.

    An operator's cancel (see :func:`is_operator`) is the owner's Undo done by someone
    else: it goes through :func:`cancel_with_hooks`, so the job's ``on_undo`` hooks run
    in its transaction, as for :func:`undo`. The app's own cancel runs the guarded
    statement alone. ``commit=False`` runs either in the caller's transaction (see
    :meth:`~flask_defer.store.transactions.Transactions.caller`).
    """
    job_id, key = identity(job_id, key)
    commit = checked_commit(commit)
    if is_operator(actor):
        outcome = cancel_with_hooks(
            state, job_id, key, owner, actor=actor, event="cancelled", operation="cancel",
            commit=commit,
        )
        return isinstance(outcome, Job)
    with state.transactions.control("cancel", commit=commit) as conn:
        cancelled = state.store.cancel(
            conn, now=utcnow(), job_id=job_id, key=key, owner=owner, actor=actor
        )
        if cancelled is None:
            refused(state, conn, job_id, key, owner)
            return False
    state.send_when_committed(signals.job_cancelled, commit=commit, job=cancelled)
    return True


def abort(state: DeferState, job_id: Any, actor: str = DEFAULT_ACTOR) -> bool:
    """Stop a job: cancel it while pending, else ask its worker to stop it; True if
    this call did either. Unknown id → :class:`JobNotFound`.

    Two guarded statements in turn, never a read first: the cancel (pending →
    cancelled, as :func:`cancel`), then the request (running, not asked yet →
    ``abort_requested_by``). A job claimed between the two is asked; one put back to
    pending between them is tried again; one that settled meanwhile is left alone
    (False).
    """
    job_id, _ = identity(job_id, None)
    assert job_id is not None
    # A failed attempt's retry (or a reclaim) can move the job from running back to
    # pending between the two statements, so neither matches: try again while the
    # job is live and not asked yet, as cancel_with_hooks does.
    for _ in range(3):
        if cancel(state, job_id, None, None, actor):
            return True
        with state.transactions.control("abort", commit=True) as conn:
            if state.store.request_abort(conn, job_id, now=utcnow(), actor=actor):
                return True
            job = state.store.get(conn, job_id=job_id)
        if job is None or job.status not in (JobStatus.PENDING, JobStatus.RUNNING):
            return False  # settled (or gone) meanwhile
        if job.status is JobStatus.RUNNING and job.abort_requested_by is not None:
            return False  # asked before
    return False


def cancel_with_hooks(
    state: DeferState,
    job_id: int | None,
    key: str | None,
    owner: str | None,
    *,
    actor: str,
    event: str,
    operation: str,
    commit: bool,
) -> Job | JobStatus:
    """The one cancel that runs ``on_undo`` hooks: the owner's Undo and an operator's cancel.

    Guarded cancel, then every hook of the job's name, in one transaction on
    ``db.session`` (its own, committed here, or with ``commit=False`` the caller's); a
    hook that raises rolls the cancel back with it in the call's own transaction, and
    with ``commit=False`` leaves both in the caller's, to roll back. Returns the
    cancelled job, or the status that refused the cancel (``RUNNING`` while a failed
    attempt keeps putting the job back). *event* names it in the history (``undone``
    or ``cancelled``) and *actor* says who. Unknown (or, with *owner*, another
    owner's) → :class:`JobNotFound`.
    """
    with state.transactions.hooked(operation, commit=commit) as conn:
        cancelled: Job | None = None
        # A failed attempt can put the job back to pending between the cancel and
        # the read below; cancelling again then is right, so try a few times.
        for _ in range(3):
            cancelled = state.store.cancel(
                conn,
                now=utcnow(),
                job_id=job_id,
                key=key,
                owner=owner,
                actor=actor,
                event=event,
            )
            if cancelled is not None:
                break
            existing = refused(state, conn, job_id, key, owner)
            if existing.status is not JobStatus.PENDING:
                return existing.status
        if cancelled is None:
            return JobStatus.RUNNING
        for hook in state.undo_hooks.for_name(cancelled.name):
            hook(cancelled)
    state.send_when_committed(signals.job_cancelled, commit=commit, job=cancelled)
    return cancelled


def cancel_many(
    state: DeferState, filters: Filters, actor: str = DEFAULT_ACTOR, *, commit: bool = True
) -> dict[str, int]:
    """Cancel matching pending jobs; ``{"cancelled": n, "in_flight": m}``.

    Each cancelled job sends ``job_cancelled``, as one :func:`cancel` does: after the
    commit, and never if the caller's transaction (``commit=False``) rolls back.
    """
    if all(filters.get(name) is None for name in ("key_prefix", "name", "owner")):
        raise InvalidArgument(
            "key_prefix", "give key_prefix, name or owner; refusing to cancel every job"
        )
    where = job_filter(filters)
    commit = checked_commit(commit)
    if is_operator(actor):
        # An operator's bulk cancel runs each job's on_undo hooks, as one cancel does,
        # all in one transaction: a hook that raises rolls it back (with commit=False,
        # the caller's transaction holds it all, and the caller rolls it back).
        with state.transactions.hooked("cancel_many", commit=commit) as conn:
            jobs, in_flight = state.store.cancel_many_jobs(
                conn, where, now=utcnow(), actor=actor
            )
            for job in jobs:
                for hook in state.undo_hooks.for_name(job.name):
                    hook(job)
    else:
        with state.transactions.control("cancel_many", commit=commit) as conn:
            jobs, in_flight = state.store.cancel_many_jobs(
                conn, where, now=utcnow(), actor=actor
            )
    for job in jobs:
        state.send_when_committed(signals.job_cancelled, commit=commit, job=job)
    return {"cancelled": len(jobs), "in_flight": in_flight}


def undo(
    state: DeferState, job_id: Any, key: Any, owner: str | None, *, commit: bool = True
) -> UndoOutcome:
    """The user's Undo: guarded cancel plus ``on_undo`` hooks in one transaction on
    ``db.session``: its own, committed here (``commit=True``), or the caller's."""
    job_id, key = identity(job_id, key)
    checked_owner = checked_text(owner, "owner")
    commit = checked_commit(commit)
    if job_id is not None and not 1 <= job_id <= MAX_JOB_ID:
        raise JobNotFound(job_id)
    # The owner undid it: the history names them, not "app".
    outcome = cancel_with_hooks(
        state,
        job_id,
        key,
        checked_owner,
        actor=checked_owner or DEFAULT_ACTOR,
        event="undone",
        operation="undo",
        commit=commit,
    )
    if isinstance(outcome, Job):
        return UndoOutcome.UNDONE
    return UndoOutcome.for_status(outcome)


#: The longest window one hold may ask for (``DEFER_UNDO_MAX_HOLD`` bounds the total).
MAX_HOLD_REQUEST = timedelta(hours=1)


def refused(
    state: DeferState,
    conn: Connection,
    job_id: int | None,
    key: str | None,
    owner: str | None = None,
) -> Job:
    """The job a guarded change just left alone, read to say why.

    Read after the guarded statement lost, never before it: the write decides, the
    read only explains. No job at all, or (with *owner*) another owner's job, is
    :class:`JobNotFound`, so other people's ids are never confirmed to exist.
    """
    existing = state.store.get(conn, job_id=job_id, key=key)
    if existing is None or (owner is not None and existing.owner != owner):
        raise JobNotFound(job_id, key)
    return existing


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
        existing = refused(state, conn, checked_id, None, checked_owner)
        if existing.undo_seconds_left(now) <= 0:
            raise JobNotPending(existing.id, existing.status.value)
        return existing  # already later than asked, or at the cap



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
            conn, when, now=now, job_id=job_id, key=key, actor=actor, event=event,
            undo_until_at_most=when - state.config.undo_margin,
        )  # fmt: skip
        if moved is None:
            existing = refused(state, conn, job_id, key)
            raise JobNotPending(existing.id, existing.status.value)
    return moved



def retry(
    state: DeferState, job_id: Any, actor: str = DEFAULT_ACTOR, *, commit: bool = True
) -> Job:
    """failed → pending, due now, attempts reset; :class:`JobNotPending` otherwise."""
    checked, _ = identity(job_id, None)
    assert checked is not None
    commit = checked_commit(commit)
    with state.transactions.control("retry", commit=commit) as conn:
        job = state.store.retry_failed(conn, checked, now=utcnow(), actor=actor)
        if job is None:
            existing = refused(state, conn, checked, None)
            raise JobNotPending(existing.id, existing.status.value, expected="failed")
    return job



def retry_many(state: DeferState, filters: Filters, actor: str = DEFAULT_ACTOR) -> int:
    """Put every matching failed job back to pending, due now; how many."""
    where = job_filter(filters)
    with state.transactions.own("retry_many") as conn:
        return state.store.retry_failed_many(conn, where, now=utcnow(), actor=actor)
