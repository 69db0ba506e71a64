"""``Defer``'s pause methods: pause and resume a queue or a job name, list the pauses.

While a queue or a job name is paused, no worker and no ``run_due`` starts a job of it
(the claim leaves it out: :mod:`flask_defer.store.pause_statements`); its jobs stay pending with
their ``run_at`` and ``due_at``, and running ones finish normally. The dashboard's
Queues page and ``flask defer pause``/``resume``/``paused`` call these methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .. import signals
from ..operations import reads
from ..operations.health import SCHEDULED_COUNT_CAP
from ..store import Pause
from ..timeutil import as_utc, utcnow
from ..validation import checked_actor, pause_target
from .declarations import FacadeBase


@dataclass(frozen=True, slots=True)
class QueueState:
    """One queue or job name as the dashboard's Queues page shows it.

    ``kind`` is ``queue`` or ``name``. ``pending`` counts every pending job (``due``
    of them are past their ``run_at``), ``running`` the jobs a worker holds. Counts are
    read from bounded index scans, so a figure in ``at_least`` is a lower bound.
    ``queue`` is, for a name, the queue its handler here puts its jobs in (None without
    a handler here); ``pause`` the pause, or None when not paused.
    """

    kind: str
    value: str
    pending: int
    due: int
    running: int
    pause: Pause | None = None
    at_least: frozenset[str] = frozenset()
    queue: str | None = None

    @property
    def paused(self) -> bool:
        """True while this queue or name is paused."""
        return self.pause is not None


class PauseMethods(FacadeBase):
    """``defer.pause`` / ``resume`` / ``paused``, and the Queues page's overview."""

    def pause(
        self, queue: str | None = None, name: str | None = None, *, actor: str | None = None
    ) -> bool:
        """Stop workers and ``run_due`` from starting jobs of a *queue* or a job *name*.

        True if this call paused it; already paused → False. Give exactly one of
        ``queue`` and ``name`` (:class:`InvalidArgument` otherwise). The jobs stay
        pending, keep their ``run_at`` and ``due_at`` (health counts the due ones as
        owed) and can still be cancelled or rescheduled; jobs already running finish.
        ``actor`` is who paused it (default ``app``). ``queue_paused`` is sent after the
        commit, by the call that paused it only. Runs a transaction of its own.
        """
        kind, value = pause_target(queue, name)
        who = checked_actor(actor)
        state = self._state()
        state.transactions.refuse_uncommitted("pause")
        paused = state.store.pause(kind=kind, value=value, now=utcnow(), actor=who)
        if paused:
            state.send(signals.queue_paused, kind=kind, value=value, actor=who)
        return paused

    def resume(
        self, queue: str | None = None, name: str | None = None, *, actor: str | None = None
    ) -> bool:
        """Let workers start the jobs of a paused *queue* or job *name* again, at once.

        True if this call resumed it; not paused → False. The waiting jobs are claimable
        as soon as this returns: on PostgreSQL the workers are notified (for a name, the
        workers of its handler's queue), on SQLite their next poll finds them. Jobs
        that fell due during the pause run now, oldest ``run_at`` first. ``queue_resumed``
        is sent after the commit, by the call that resumed it only.
        """
        kind, value = pause_target(queue, name)
        who = checked_actor(actor)
        state = self._state()
        state.transactions.refuse_uncommitted("resume")
        wake: set[str] = set()
        if kind == "name":
            spec = self.registry.get(value)
            wake.add(spec.queue if spec is not None else "default")
        resumed = state.store.resume(kind=kind, value=value, wake=wake)
        if resumed:
            state.send(signals.queue_resumed, kind=kind, value=value, actor=who)
        return resumed

    def paused(self) -> list[Pause]:
        """Every paused queue and job name (queues first), with when and who paused it."""
        return self._state().store.paused()

    def queues(self, now: datetime | None = None) -> list[QueueState]:
        """Each queue and job name known, with its live jobs and whether it is paused.

        Known: the queues and names of the registered handlers, those with pending or
        running jobs, and the paused ones. Queues first, then names, each by name. Read
        from the partial indexes of live rows, bounded (``SCHEDULED_COUNT_CAP`` rows per
        figure for queues): what the dashboard's Queues page shows, cheap to refresh.
        """
        # Long because: the two lists are assembled from three reads side by side.
        at = as_utc(now, "now") if now is not None else utcnow()
        state = self._state()
        health = reads.health(state, at)
        with state.transactions.joined() as conn:
            counts, capped = state.store.queue_counts(conn, now=at, cap=SCHEDULED_COUNT_CAP)
        pauses = {(p.kind, p.value): p for p in state.store.paused()}
        specs = {name: self.registry.get(name) for name in self.registry.names()}
        by_queue = {c.queue: c for c in counts}
        queue_names = (
            {spec.queue for spec in specs.values() if spec is not None}
            | set(by_queue)
            | {value for kind, value in pauses if kind == "queue"}
        )
        # A figure whose scan stopped at the cap is "at least" for every queue.
        queue_bounds = set(capped & {"due", "running"})
        if capped & {"due", "scheduled"}:
            queue_bounds.add("pending")
        rows = []
        for queue in sorted(queue_names):
            found = by_queue.get(queue)
            due, scheduled, running = (
                (found.due, found.scheduled, found.running) if found is not None else (0, 0, 0)
            )
            rows.append(
                QueueState(
                    "queue",
                    queue,
                    pending=due + scheduled,
                    due=due,
                    running=running,
                    pause=pauses.get(("queue", queue)),
                    at_least=frozenset(queue_bounds),
                )
            )
        by_name = {item.name: item for item in health.by_name}
        names = (
            set(specs)
            | {n for n, h in by_name.items() if h.counts.get("pending") or h.counts.get("running")}
            | {value for kind, value in pauses if kind == "name"}
        )
        for name in sorted(names):
            item = by_name.get(name)
            pending = item.counts.get("pending", 0) if item is not None else 0
            running = item.counts.get("running", 0) if item is not None else 0
            due = item.owed - running if item is not None else 0
            spec = specs.get(name)
            rows.append(
                QueueState(
                    "name",
                    name,
                    pending=pending,
                    due=due,
                    running=running,
                    pause=pauses.get(("name", name)),
                    at_least=frozenset({"pending"} & health.lower_bounds),
                    queue=spec.queue if spec is not None else None,
                )
            )
        return rows
