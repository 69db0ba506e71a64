"""Cancels: the app's own, an operator's, and the owner's Undo, over one app's state.

Every cancel is one guarded statement. Those that run the ``on_undo`` hooks (the
owner's Undo and an operator's cancel) share one path, :func:`cancel_with_hooks`, so
the hooks, the transaction and the history's wording are the same whoever stops the
job; the app's own cancel (no actor) runs the statement alone.
"""

from __future__ import annotations

from typing import Any

from .. import signals
from ..errors import InvalidArgument, JobNotFound
from ..jobs import Job, JobStatus
from ..timeutil import utcnow
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
            state.refused(conn, job_id, key, owner)
            return False
    state.send_when_committed(signals.job_cancelled, commit=commit, job=cancelled)
    return True


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
    hook that raises rolls the cancel back with it. Returns the cancelled job, or the
    status that refused the cancel (``RUNNING`` while a failed attempt keeps putting
    the job back). *event* names it in the history (``undone`` or ``cancelled``) and
    *actor* says who. Unknown (or, with *owner*, another owner's) → :class:`JobNotFound`.
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
            existing = state.refused(conn, job_id, key, owner)
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
    """Cancel matching pending jobs; ``{"cancelled": n, "in_flight": m}``."""
    if all(filters.get(name) is None for name in ("key_prefix", "name", "owner")):
        raise InvalidArgument(
            "key_prefix", "give key_prefix, name or owner; refusing to cancel every job"
        )
    where = job_filter(filters)
    commit = checked_commit(commit)
    if is_operator(actor):
        # An operator's bulk cancel runs each job's on_undo hooks, as one cancel does,
        # all in one transaction: a hook that raises leaves every job pending.
        with state.transactions.hooked("cancel_many", commit=commit) as conn:
            jobs, in_flight = state.store.cancel_many_jobs(
                conn, where, now=utcnow(), actor=actor
            )
            for job in jobs:
                for hook in state.undo_hooks.for_name(job.name):
                    hook(job)
        return {"cancelled": len(jobs), "in_flight": in_flight}
    with state.transactions.control("cancel_many", commit=commit) as conn:
        cancelled, in_flight = state.store.cancel_many(conn, where, now=utcnow(), actor=actor)
    return {"cancelled": cancelled, "in_flight": in_flight}


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
