"""The health report: is the system keeping its promises?

The figure that matters is **owed** work: jobs that are due and not settled. A job
scheduled for next month is *scheduled*, not a backlog. The age of the oldest owed job
is measured from when it first became due, so a retry's backoff does not hide it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from .store import StatusCounts


@dataclass(frozen=True, slots=True)
class Health:
    """One snapshot of the jobs table, as ``defer.health()`` returns it."""

    counts: dict[str, int]
    scheduled: int
    owed: int
    oldest_owed_age: float | None
    failed: int
    lapsed_leases: int
    unknown_handlers: int
    measured_at: datetime

    @classmethod
    def from_counts(
        cls, counts: StatusCounts, *, unknown_handlers: int, now: datetime
    ) -> Health:
        oldest = counts.oldest_owed_due_at
        return cls(
            counts={status: counts.by_status.get(status, 0) for status in _STATUSES},
            scheduled=counts.scheduled,
            owed=counts.owed,
            oldest_owed_age=max((now - oldest).total_seconds(), 0.0) if oldest else None,
            failed=counts.by_status.get("failed", 0),
            lapsed_leases=counts.lapsed_leases,
            unknown_handlers=unknown_handlers,
            measured_at=now,
        )

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready form (``flask defer status --json``)."""
        data = asdict(self)
        data["measured_at"] = self.measured_at.isoformat()
        return data


_STATUSES = ("pending", "running", "done", "failed", "cancelled")
