"""The plain values the store takes and returns (besides :class:`~flask_defer.Job`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..jobs import JobStatus

#: PostgreSQL channel a scheduling transaction notifies; workers LISTEN on it.
NOTIFY_CHANNEL = "flask_defer"

#: How ``last_error`` starts on a job left pending because no worker knew its name;
#: health counts these even when the process asking knows the name.
UNKNOWN_HANDLER_NOTE = "no handler registered"


@dataclass(frozen=True, slots=True)
class NewJob:
    """What ``schedule()`` asks the store to write, already validated and normalised."""

    name: str
    payload: Any
    run_at: datetime
    max_attempts: int
    queue: str = "default"
    key: str | None = None
    owner: str | None = None
    label: str | None = None
    undo_until: datetime | None = None


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

    @classmethod
    def total(cls, parts: Sequence[StatusCounts]) -> StatusCounts:
        """Sum per-name figures into one."""
        oldest = [p.oldest_owed_due_at for p in parts if p.oldest_owed_due_at is not None]
        return cls(
            name=None,
            by_status={s.value: sum(p.by_status.get(s.value, 0) for p in parts) for s in JobStatus},
            scheduled=sum(p.scheduled for p in parts),
            owed=sum(p.owed for p in parts),
            oldest_owed_due_at=min(oldest) if oldest else None,
            lapsed_leases=sum(p.lapsed_leases for p in parts),
        )


@dataclass(frozen=True, slots=True)
class BatchAppend:
    """Where :meth:`JobStore.batch_append` put an item: the batch, its size and due time."""

    job_id: int
    run_at: datetime
    items: int


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
