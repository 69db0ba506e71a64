"""Workflows: a group of jobs with one callback, and a child's view of its parents.

A job that runs after others is ``schedule(..., after=...)`` (:mod:`.scheduling`); the
store keeps the edges and releases children as parents settle
(``store.dependencies``). A group is built on the same edges: its members are
ordinary jobs, and its ``then`` job is their common child, so "runs once, after the
last member settles" is the release's own guarantee (each edge counted once, the
count lowered by the database), not a counter this code reads.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import InvalidArgument
from ..jobs import Group, Job
from ..store.dependencies import MAX_PARENTS
from ..validation import payload_text
from .scheduling import checked_after, schedule, spec_for
from .state import DeferState


def group(
    state: DeferState,
    name: str,
    payloads: Iterable[Any],
    *,
    then: str,
    then_payload: Any = None,
    on: str = "done",
    queue: str | None = None,
    priority: int | None = None,
    actor: str | None = None,
) -> Group:
    """Schedule one job of *name* per payload, and *then* after them all (joining the
    caller's transaction: all of it commits, or none).

    *on* is the ``then`` job's ``after_policy``: ``"done"`` runs it only if every member
    ended done (else it is cancelled, naming the member), ``"settled"`` whatever their
    outcomes. *queue* and *priority* apply to every job of the group.
    """
    if isinstance(payloads, str | bytes) or not isinstance(payloads, Iterable):
        raise InvalidArgument("payloads", f"expected a list of payloads, got {payloads!r}")
    items = list(payloads)
    if not items:
        raise InvalidArgument("payloads", "a group needs at least one member")
    if len(items) > MAX_PARENTS:
        raise InvalidArgument(
            "payloads", f"at most {MAX_PARENTS:,} members, got {len(items):,}"
        )
    if not isinstance(then, str):
        raise InvalidArgument("then", f"expected the name of a registered job, got {then!r}")
    checked_after(None, on, name="on")
    # Both names and every payload first: nothing is written for a group that cannot
    # be whole (a bad payload met at member k would leave the members before it in
    # the caller's transaction, to run without their callback if it commits).
    spec_for(state, name)
    spec_for(state, then)
    limit = state.config.max_payload_bytes
    for index, payload in enumerate(items):
        if payload is not None:
            payload_text(payload, f"payloads[{index}]", max_bytes=limit)
    if then_payload is not None:
        payload_text(then_payload, "then_payload", max_bytes=limit)
    # One transaction for the whole group: the caller's (the session), or, in an app
    # without one, a single one of its own, so no member commits without the others.
    with state.transactions.joined(writes=True) as conn:
        members = [
            schedule(state, name, payload, queue=queue, priority=priority, actor=actor, conn=conn)
            for payload in items
        ]
        then_job = schedule(
            state, then, then_payload, after=members, after_policy=on,
            queue=queue, priority=priority, actor=actor, conn=conn,
        )  # fmt: skip
    return Group(id=then_job.id, jobs=tuple(members), then_job=then_job)


def parents(state: DeferState, job: Job | int) -> list[Job]:
    """The jobs *job* was scheduled after (a group's members for its ``then`` job),
    oldest first, as they are now: status, ``result`` and ``last_error`` included."""
    job_id = job.id if isinstance(job, Job) else job
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise InvalidArgument("job", f"expected a Job or a job id, got {job!r}")
    with state.transactions.joined() as conn:
        return state.store.parents(conn, job_id)


def children(state: DeferState, job_id: int, *, limit: int = 100) -> list[Job]:
    """The jobs scheduled after *job_id* (the dashboard's job page), oldest first."""
    with state.transactions.joined() as conn:
        return state.store.children(conn, job_id, limit=limit)
