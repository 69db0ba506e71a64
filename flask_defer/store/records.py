"""The plain values the store takes and returns (besides :class:`~flask_defer.Job`)."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..jobs import JobStatus

#: PostgreSQL channel a scheduling transaction notifies; workers LISTEN on it.
NOTIFY_CHANNEL = "flask_defer"
#: The channel of a worker's LISTEN self-test: a notification it sends itself.
PROBE_CHANNEL = "flask_defer_probe"

#: How ``last_error`` starts on a job left pending because no worker knew its name;
#: health counts these even when the process asking knows the name.
UNKNOWN_HANDLER_NOTE = "no handler registered"

#: Settled rows (done, cancelled) health counts per status at most, the latest first:
#: beyond it health and the dashboard say "1,000+" rather than read a history of
#: millions on every refresh. Grouping rows by name is what a count costs (SQLite sorts
#: them), so the cap is what one health call costs: 1,000 keeps it near a millisecond.
SETTLED_COUNT_CAP = 1_000

#: Scheduled rows (pending, not due yet) health counts at most, the soonest first: a
#: calendar of a million future jobs is not owed work, and counting all of it would make
#: every health check read all of it. Owed, running and failed rows are counted exactly.
SCHEDULED_COUNT_CAP = 1_000


@dataclass(slots=True)
class NewJob:
    """What ``schedule()`` asks the store to write, already validated and normalised.

    Not frozen, though nothing changes one once built (``dataclasses.replace`` makes
    a changed copy): a frozen dataclass sets each of these twenty fields through
    ``object.__setattr__``, which made building one cost 6 µs instead of 1.5 µs, paid
    per job by a bulk enqueue (measured; 15% of ``schedule_many`` of 10,000 jobs).
    """

    name: str
    payload: Any
    run_at: datetime
    max_attempts: int
    queue: str = "default"
    key: str | None = None
    owner: str | None = None
    label: str | None = None
    undo_until: datetime | None = None
    #: The Undo toast's texts for its other states (``undoable(done_label=...)``).
    waiting_label: str | None = None
    done_label: str | None = None
    failed_label: str | None = None
    undone_label: str | None = None
    #: Queue controls (see :class:`~flask_defer.Job`), validated by the caller.
    priority: int = 0
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    expires_at: datetime | None = None
    #: A rate-limited handler's limit: ``rate_limit`` starts per ``rate_period`` seconds
    #: in the bucket its ``concurrency_key`` names.
    rate_limit: int | None = None
    rate_period: float | None = None
    #: ``payload`` already encoded as the JSON text it is stored as (the bulk path
    #: validates by encoding it), so the insert does not encode it a second time.
    payload_json: str | None = None


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Conditions of ``list`` and the bulk operations; ``None`` means "any"."""

    statuses: tuple[JobStatus, ...] | None = None
    name: str | None = None
    key_prefix: str | None = None
    owner: str | None = None
    queue: str | None = None


@dataclass(frozen=True, slots=True)
class StatusCounts:
    """Figures the health report is built from, for one job name or (``name=None``) all."""

    name: str | None
    by_status: dict[str, int]
    scheduled: int
    owed: int
    oldest_owed_due_at: datetime | None
    lapsed_leases: int
    #: Pending jobs a worker left for want of a handler (``UNKNOWN_HANDLER_NOTE``).
    unknown_to_worker: int = 0
    #: Statuses whose count stopped at the settled-count cap: "at least this many".
    lower_bounds: frozenset[str] = frozenset()

    def unknown(self, known_names: Collection[str]) -> int:
        """Pending jobs of this name that no handler here, or in a worker, can run."""
        if self.name is not None and self.name not in known_names:
            return self.by_status.get(JobStatus.PENDING.value, 0)
        return self.unknown_to_worker

    @classmethod
    def total(cls, parts: Sequence[StatusCounts]) -> StatusCounts:
        """Sum per-name figures into one (a sum with a lower bound in it is one too)."""
        oldest = [p.oldest_owed_due_at for p in parts if p.oldest_owed_due_at is not None]
        return cls(
            name=None,
            by_status={s.value: sum(p.by_status.get(s.value, 0) for p in parts) for s in JobStatus},
            scheduled=sum(p.scheduled for p in parts),
            owed=sum(p.owed for p in parts),
            oldest_owed_due_at=min(oldest) if oldest else None,
            lapsed_leases=sum(p.lapsed_leases for p in parts),
            unknown_to_worker=sum(p.unknown_to_worker for p in parts),
            lower_bounds=frozenset().union(*(p.lower_bounds for p in parts)),
        )


@dataclass(frozen=True, slots=True)
class BatchAppend:
    """Where :meth:`JobStore.batch_append` put an item: the batch, its size and due time."""

    job_id: int
    run_at: datetime
    items: int


#: The acknowledgement statuses that settle a job (its children may then be released).
SETTLING = ("done", "failed")


@dataclass(frozen=True, slots=True)
class Ack:
    """One claimed job's outcome, to be written by :meth:`JobStore.acknowledge_many`.

    Built by the executor when a handler returns; written later in a batch with
    others, still compare-and-set on ``(id, claim_token)`` per row. ``status`` is
    what the row becomes: ``done`` or ``failed`` (settled, ``finished_at`` = the
    flush's now), or ``pending`` (a retry or a snooze at ``run_at``).
    """

    job_id: int
    claim_token: str
    status: str
    run_at: datetime | None = None
    #: A snooze that is not owed any more (``NotYet``) counts as due from ``run_at``.
    due_at: datetime | None = None
    #: -1 gives the attempt back (a snooze), 0 keeps it spent.
    attempts_delta: int = 0
    last_error: str | None = None
    #: Only a ``done`` ack writes the result (None is a valid result there).
    result: Any = None
    #: The job's attempt this outcome ends, for its history event.
    attempt: int = 0

    @property
    def event(self) -> str:
        """The history event this outcome is: done, failed, retried or snoozed."""
        if self.status != JobStatus.PENDING.value:
            return self.status
        # A snooze gives its attempt back; a retry keeps it spent.
        return "snoozed" if self.attempts_delta < 0 else "retried"

    def result_json(self) -> str | None:
        """The stored form of a done ack's result: JSON text, as the JSON column writes
        it (``null`` for None); None for any other status, which keeps the row's."""
        if self.status != _DONE:
            return None
        if self.result is None:
            return "null"  # most handlers return nothing: no encoder for it
        return _RESULT_ENCODER.encode(self.result)


_DONE = JobStatus.DONE.value
#: ``json.dumps(result, allow_nan=False)``, its encoder built once: ``dumps`` builds
#: one per call when given any option.
_RESULT_ENCODER = json.JSONEncoder(allow_nan=False)


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """One row for the history table, written with the transition it records."""

    job_id: int
    event: str
    at: datetime
    actor: str
    attempt: int
    error: str | None = None
    run_at: datetime | None = None

    def row(self) -> dict[str, Any]:
        """The insert's parameters."""
        return {
            "job_id": self.job_id,
            "event": self.event,
            "at": self.at,
            "actor": self.actor,
            "attempt": self.attempt,
            "error": self.error,
            "run_at": self.run_at,
        }


@dataclass(frozen=True, slots=True)
class Pause:
    """A paused queue or job name, as ``defer.paused()`` lists it.

    ``kind`` is ``queue`` or ``name``; ``value`` the queue or job name; ``paused_at``
    when the pause began (aware UTC); ``actor`` who paused it.
    """

    kind: str
    value: str
    paused_at: datetime
    actor: str

    @property
    def label(self) -> str:
        """``queue:emails`` or ``name:send_digest``: how health lists it."""
        return f"{self.kind}:{self.value}"


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """One queue's live jobs, as the dashboard's Queues page shows them (bounded counts)."""

    queue: str
    #: Pending and due (``run_at`` passed): what a worker would start now if not paused.
    due: int
    #: Pending and not due yet.
    scheduled: int
    running: int


@dataclass(frozen=True)
class BatchItems:
    """The expressions of one batch append, in the driver's JSON dialect."""

    #: Items in the batch before the append, and after it (over the updated row).
    count_before: Any
    count_after: Any
    #: The payload with the item appended to its ``items`` list.
    appended: Any
    #: The batch's ``flush_by`` deadline as a comparable time (NULL if unset).
    flush_by: Any
    #: The SQL function that takes the earlier of two times.
    earliest: Any


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker (or ``run_due`` while it holds jobs), as ``defer.workers()`` returns it.

    ``id`` is ``<host>:<pid>:<random>``; ``kind`` is ``worker`` or ``run_due``;
    ``queues`` are the queues it claims from (empty: every queue); ``running`` the ids of
    the jobs it holds at its last heartbeat. ``stale`` is True once two heartbeats were
    missed (``last_seen`` older than twice ``heartbeat_seconds``): the worker was killed
    or cannot reach the database; its row goes a day later. ``listening`` says whether
    its LISTEN hears NOTIFY (PostgreSQL; False: it polls, see docs/storage.md), None
    where it has none.
    """

    id: str
    kind: str
    host: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    version: str
    started_at: datetime
    last_seen: datetime
    heartbeat_seconds: float
    running: tuple[int, ...]
    stale: bool
    listening: bool | None = None
    #: The job names it has handlers for.
    names: tuple[str, ...] = ()

    def serves(self, queue: str) -> bool:
        """Whether it claims jobs of *queue*."""
        return not self.queues or queue in self.queues
