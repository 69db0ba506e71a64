"""``Defer``'s visibility methods (:mod:`flask_defer.operations.visibility`): the live
workers (the dashboard's Workers page, ``flask defer workers``) and why a job waits
(its page, ``flask defer explain``)."""

from __future__ import annotations

from datetime import datetime

from ..operations import visibility
from ..operations.visibility import Reason
from ..store import ActivityBucket, WorkerInfo
from .declarations import FacadeBase


class VisibilityMethods(FacadeBase):
    """``defer.workers``, ``defer.explain`` and ``defer.activity``."""

    def activity(
        self,
        since: datetime | None = None,
        bucket: str = "minute",
        *,
        queue: str | None = None,
        name: str | None = None,
    ) -> list[ActivityBucket]:
        """Runs per minute (kept two hours; default: the last hour) or per hour (kept
        eight days; default: the last seven), oldest first; empty buckets left out.

        Each :class:`~flask_defer.ActivityBucket` has ``.start``, ``.started``,
        ``.done``, ``.failed``, ``.retried`` and the p50/p95 lateness (an upper estimate
        from a histogram). *queue* or *name* narrows it to one queue or job name.
        Workers count in memory and write every few seconds, so the current minute
        trails by that much; a worker killed outright loses at most those seconds.
        """
        return visibility.activity(self._state(), since, bucket, queue=queue, name=name)

    def activity_keys(self, since: datetime) -> tuple[list[str], list[str]]:
        """The queues and job names with activity since *since*."""
        return visibility.activity_keys(self._state(), since)

    def explain(self, id: int) -> list[Reason]:
        """Every reason pending job *id* has not started yet, as :class:`Reason` values
        (``.code``, a translated ``.text``; see :class:`~flask_defer.Reason` for the
        codes). [] for a job that is not pending; :class:`JobNotFound` for an unknown id.
        At most five queries, whatever the table holds.
        """
        return visibility.explain(self._state(), id)

    def workers(self) -> list[WorkerInfo]:
        """Every worker, and every ``run_due`` while it holds jobs: live ones first.

        Each :class:`~flask_defer.WorkerInfo` has ``.id`` ``.host`` ``.pid``
        ``.queues`` (empty: all) ``.concurrency`` ``.started_at`` ``.last_seen``
        ``.running`` (the job ids it holds) and ``.stale``: True after two missed
        heartbeats (a heartbeat is a third of ``DEFER_LEASE``), so a worker killed with
        ``kill -9`` shows stale within two heartbeats; its row goes after a day. Rows
        are written by the workers themselves: one that stopped gracefully is gone.
        A ``run_due`` appears from its first heartbeat on: a shorter call never does.
        """
        return visibility.workers(self._state())
