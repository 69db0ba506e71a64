"""The health report: is the system keeping its promises?

The figure that matters is **owed** work: jobs that are due and not settled. A job
scheduled for next month is *scheduled*, not a backlog. The age of the oldest owed job
is measured from when it first became due, so a retry's backoff does not hide it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from ..store import SCHEDULED_COUNT_CAP, SETTLED_COUNT_CAP, StatusCounts

__all__ = ["SCHEDULED_COUNT_CAP", "SETTLED_COUNT_CAP", "Health", "NameHealth"]


@dataclass(frozen=True, slots=True)
class NameHealth:
    """The health figures of one job name."""

    name: str
    counts: dict[str, int]
    scheduled: int
    owed: int
    oldest_owed_age: float | None
    failed: int
    lapsed_leases: int
    #: True when no handler for this name is registered in this process.
    unknown: bool
    #: Statuses whose count is a lower bound (settled history past the count cap).
    lower_bounds: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Health:
    """One snapshot of the jobs table, as ``defer.health()`` returns it.

    ``by_name`` lists the same figures per job name, worst backlog first (most owed,
    then oldest owed). Owed, running and failed figures are exact; the settled ones
    (done, cancelled) are counted up to ``SETTLED_COUNT_CAP`` rows and scheduled ones
    (pending, not due yet) up to ``SCHEDULED_COUNT_CAP``, and a status whose count
    reached its cap is in ``lower_bounds`` ("at least this many"; ``pending`` there
    means ``scheduled`` is a lower bound too). So a health check costs the same with a
    million rows of history or of future jobs as with ten.
    """

    counts: dict[str, int]
    scheduled: int
    owed: int
    oldest_owed_age: float | None
    failed: int
    lapsed_leases: int
    unknown_handlers: int
    measured_at: datetime
    by_name: tuple[NameHealth, ...] = ()
    lower_bounds: frozenset[str] = frozenset()
    #: Recurring schedules whose tick was not written on time (more than a minute
    #: overdue, say because no worker runs). Counted in ``owed`` too: a tick that was
    #: never written is backlog as much as a job that was never run.
    late_schedules: int = 0
    #: Ids of schedules, not orphaned, that no running code declared in the last ten
    #: minutes (at most 50): removed from the code (orphaned when
    #: ``DEFER_SCHEDULE_ORPHAN_GRACE`` ends; ``defer.forget_recurring`` does it now), or
    #: declared only by a release that is not running. Nobody ticks them meanwhile.
    #: The ids the process asking declares are never listed (it runs and declares them).
    undeclared_schedules: tuple[str, ...] = ()
    #: Paused queues and job names, as ``queue:emails`` and ``name:send_digest`` (queues
    #: first). Their jobs stay pending and, once due, count as owed: paused work is late.
    paused: tuple[str, ...] = ()
    #: Rate buckets (``rate:send_sms``, ``rate:send_sms:tenant:7``) that are full now
    #: while due jobs wait in them (at most 50): ``@defer.job(rate_limit=...)`` is
    #: holding those jobs back. They count as owed too.
    rate_limited: tuple[str, ...] = ()
    #: Queues with due jobs that no live worker claims from (``defer.workers()``): none
    #: runs, none serves that queue, or they are all stale. A cron ``run_due`` between
    #: runs counts as none.
    unserved_queues: tuple[str, ...] = ()
    #: Live workers on PostgreSQL whose LISTEN does not hear NOTIFY (behind a
    #: transaction-mode pooler without ``DEFER_LISTEN_DATABASE_URI``): they poll, so a
    #: due job may start up to a poll interval late.
    deaf_workers: tuple[str, ...] = ()

    @classmethod
    def from_counts(
        cls,
        parts: list[StatusCounts],
        *,
        known_names: Collection[str],
        now: datetime,
        unknown_handlers: int | None = None,
        late_schedules: int = 0,
        oldest_late_tick: datetime | None = None,
        undeclared_schedules: tuple[str, ...] = (),
        paused: tuple[str, ...] = (),
        rate_limited: tuple[str, ...] = (),
        unserved_queues: tuple[str, ...] = (),
        deaf_workers: tuple[str, ...] = (),
    ) -> Health:
        """Health from per-name counts; *unknown_handlers* defaults to the counts' own."""
        total = StatusCounts.total(parts)
        if unknown_handlers is None:
            unknown_handlers = sum(part.unknown(known_names) for part in parts)
        by_name = [
            NameHealth(
                name=part.name or "",
                counts=part.by_status,
                scheduled=part.scheduled,
                owed=part.owed,
                oldest_owed_age=_age(part.oldest_owed_due_at, now),
                failed=part.by_status.get("failed", 0),
                lapsed_leases=part.lapsed_leases,
                unknown=part.name not in known_names,
                lower_bounds=part.lower_bounds,
            )
            for part in parts
        ]
        by_name.sort(key=lambda h: (-h.owed, -(h.oldest_owed_age or 0.0), h.name))
        oldest = total.oldest_owed_due_at
        if oldest_late_tick is not None and (oldest is None or oldest_late_tick < oldest):
            oldest = oldest_late_tick
        return cls(
            counts=total.by_status,
            scheduled=total.scheduled,
            owed=total.owed + late_schedules,
            oldest_owed_age=_age(oldest, now),
            failed=total.by_status.get("failed", 0),
            lapsed_leases=total.lapsed_leases,
            unknown_handlers=unknown_handlers,
            measured_at=now,
            by_name=tuple(by_name),
            lower_bounds=total.lower_bounds,
            late_schedules=late_schedules,
            undeclared_schedules=undeclared_schedules,
            paused=paused,
            rate_limited=rate_limited,
            unserved_queues=unserved_queues,
            deaf_workers=deaf_workers,
        )

    @property
    def ok(self) -> bool:
        """No lapsed leases and no jobs waiting for a handler that is not deployed."""
        return self.lapsed_leases == 0 and self.unknown_handlers == 0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready form (``flask defer status --json``)."""
        data = asdict(self)
        data["measured_at"] = self.measured_at.isoformat()
        data["lower_bounds"] = sorted(self.lower_bounds)
        data["undeclared_schedules"] = list(self.undeclared_schedules)
        data["paused"] = list(self.paused)
        data["rate_limited"] = list(self.rate_limited)
        data["unserved_queues"] = list(self.unserved_queues)
        data["deaf_workers"] = list(self.deaf_workers)
        data["by_name"] = [
            {**asdict(h), "lower_bounds": sorted(h.lower_bounds)} for h in self.by_name
        ]
        return data


def _age(since: datetime | None, now: datetime) -> float | None:
    return max((now - since).total_seconds(), 0.0) if since is not None else None
