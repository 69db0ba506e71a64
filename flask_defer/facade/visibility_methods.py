"""``Defer``'s visibility methods: the live workers (:mod:`flask_defer.operations.
visibility`), what the dashboard's Workers page and ``flask defer workers`` show."""

from __future__ import annotations

from ..operations import visibility
from ..store import WorkerInfo
from .declarations import FacadeBase


class VisibilityMethods(FacadeBase):
    """``defer.workers``."""

    def workers(self) -> list[WorkerInfo]:
        """Every worker, and every ``run_due`` while it holds jobs: live ones first.

        Each :class:`~flask_defer.WorkerInfo` has ``.id`` ``.host`` ``.pid``
        ``.queues`` (empty: all) ``.concurrency`` ``.started_at`` ``.last_seen``
        ``.running`` (the job ids it holds) and ``.stale``: True after two missed
        heartbeats (a heartbeat is a third of ``DEFER_LEASE``), so a worker killed with
        ``kill -9`` shows stale within two heartbeats; its row goes after a day. Rows
        are written by the workers themselves: one that stopped gracefully is gone.
        """
        return visibility.workers(self._state())
