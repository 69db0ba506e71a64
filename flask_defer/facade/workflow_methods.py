"""``Defer``'s workflow methods: groups with one callback, and a job's parents.

A job that runs after others is ``defer.schedule(..., after=...)``; these add the
group (members in parallel, then one callback) and the reads a handler and the
dashboard need (:mod:`flask_defer.operations.workflows`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..jobs import Group, Job
from ..operations import workflows
from .declarations import FacadeBase


class WorkflowMethods(FacadeBase):
    """``defer.group`` and ``defer.parents``."""

    def group(
        self,
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
        """Schedule one job of *name* per payload to run in parallel, and the job *then*
        (with *then_payload*) to run once after the last of them settles.

        ``on="done"`` (the default) runs *then* only if every member ended ``done``;
        otherwise it is cancelled, its ``last_error`` naming the member.
        ``on="settled"`` runs it whatever the members' outcomes. Its handler reads the
        members, results included, with :meth:`parents`. *queue* and *priority* apply
        to every job of the group. Joins the caller's transaction, like
        :meth:`schedule`. At most 1,000 members (:class:`InvalidArgument` naming
        ``payloads``); both names must be registered (:class:`UnknownJob`).

        Returns a :class:`~flask_defer.Group`: ``.id`` (the *then* job's id),
        ``.jobs`` (the members) and ``.then_job``.
        """
        return workflows.group(
            self._state(), name, payloads, then=then, then_payload=then_payload, on=on,
            queue=queue, priority=priority, actor=actor,
        )  # fmt: skip

    def parents(self, job: Job | int) -> list[Job]:
        """The jobs *job* (a Job or an id) was scheduled after, oldest first, as they are
        now (status, ``result``, ``last_error``): a group's members for its ``then``
        job. A pruned parent is left out; a job scheduled without ``after`` has none."""
        return workflows.parents(self._state(), job)

    def children(self, job: Job | int, *, limit: int = 100) -> list[Job]:
        """The jobs scheduled after *job* (a Job or an id), oldest first, at most
        *limit*: what the dashboard's job page lists."""
        job_id = job.id if isinstance(job, Job) else job
        return workflows.children(self._state(), job_id, limit=limit)
