"""When recurring schedules tick: cron rules in an IANA zone, fixed intervals, catch-up.

Pure Python (no Flask, no SQL), so every DST corner is tested by handing in times.

* A **cron** rule is a 5-field expression evaluated in wall-clock time of its zone by
  cronsim, which follows Debian cron across DST changes: a time that does not exist
  (spring forward) runs once at the next valid instant, a time that happens twice
  (fall back) runs once, at its first occurrence; rules whose minute or hour field
  starts with ``*`` (``*/30 * * * *``, ``*/15 2 * * *``) keep ticking by wall-clock
  time through both: an hour skipped in spring has none of their ticks, an hour
  repeated in autumn has them twice.
* An **interval** rule (``every=timedelta(...)``) ticks at whole multiples of the
  interval since the Unix epoch in UTC, so every process computes the same ticks
  (``every=timedelta(minutes=5)`` ticks at :00, :05, ...) whoever synced first.
* :func:`plan` decides which ticks between the schedule's stored next tick and *now*
  become jobs, under the catch-up policy.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .errors import InvalidArgument
from .timeutil import as_utc

CatchUp = Literal["latest", "skip", "all"]
CATCH_UP_POLICIES: tuple[CatchUp, ...] = ("latest", "skip", "all")

#: A tick written later than this after its time counts as missed: catch-up policies
#: apply to it, and health reports its schedule as late. A tick written sooner is on
#: time and always runs (a worker briefly busy, or ``run_due`` from a per-minute cron).
ON_TIME = timedelta(minutes=1)

#: Schedule ids appear in URLs, job keys and the CLI: keep them plain.
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TINY = timedelta(microseconds=1)
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class Rule:
    """When a schedule ticks: a cron expression in *tz*, or a fixed interval."""

    cron: str | None
    every: timedelta | None
    tz: str = "UTC"
    zone: ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "zone", _zone(self.tz))

    def first_at_or_after(self, moment: datetime) -> datetime:
        """The first tick at *moment* or later (UTC)."""
        return self.next_after(moment - _TINY)

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after *moment* (UTC)."""
        if self.every is not None:
            step = self.every // _MICROSECOND
            elapsed = (moment - _EPOCH) // _MICROSECOND
            return _EPOCH + _MICROSECOND * ((elapsed // step + 1) * step)
        assert self.cron is not None
        # cronsim reads a fixed-time rule's start as a wall-clock time without its fold:
        # from the second pass of a repeated hour (fall back) it answers that day's
        # tick of the first pass, which is before *moment*. Read on to a later one.
        for found in CronSim(self.cron, moment.astimezone(self.zone)):
            tick: datetime = found.astimezone(UTC)
            if tick > moment:
                return tick
        raise AssertionError("unreachable: a valid cron rule ticks forever")  # pragma: no cover

    def last_at_or_before(self, moment: datetime) -> datetime:
        """The latest tick at *moment* or earlier (UTC)."""
        return self.previous_before(moment + _TINY)

    def previous_before(self, moment: datetime) -> datetime:
        """The latest tick strictly before *moment* (UTC)."""
        if self.every is not None:
            step = self.every // _MICROSECOND
            elapsed = (moment - _EPOCH) // _MICROSECOND
            return _EPOCH + _MICROSECOND * (((elapsed - 1) // step) * step)
        assert self.cron is not None
        found: datetime = next(
            iter(CronSim(self.cron, moment.astimezone(self.zone), reverse=True))
        ).astimezone(UTC)
        # The same fold, read backwards: from the second pass of a repeated hour the
        # search starts from the first pass and skips the ticks since (that day's tick
        # of a fixed-time rule). Walk forward to the latest one before *moment*.
        while (later := self.next_after(found)) < moment:
            found = later
        return found

    def describe(self) -> str:
        """A short text for lists: ``0 9 * * MON (Europe/Berlin)`` or ``every 0:05:00``."""
        if self.cron is not None:
            return f"{self.cron} ({self.tz})"
        return f"every {self.every}"


@dataclass(frozen=True, slots=True)
class RecurringSpec:
    """One ``defer.recurring(...)`` declaration, validated."""

    id: str
    job_name: str
    rule: Rule
    payload: Any
    catch_up: CatchUp


@dataclass(frozen=True, slots=True)
class Plan:
    """What to write for one due schedule: the ticks (oldest first) and the next tick."""

    ticks: tuple[datetime, ...]
    next_tick: datetime
    #: True when catch-up "all" hit its bound and older missed ticks were dropped.
    truncated: bool = False


#: The longest interval of an ``every=`` rule.
MAX_EVERY = timedelta(days=36_525)


def make_rule(cron: Any, every: Any, tz: Any) -> Rule:
    """A validated :class:`Rule`; errors name the argument (``cron``, ``every``, ``tz``)."""
    if (cron is None) == (every is None):
        given = "neither" if cron is None else "both"
        raise InvalidArgument(
            "cron", f"pass either cron='...' or every=timedelta(...); got {given}"
        )
    if cron is not None:
        if not isinstance(cron, str):
            raise InvalidArgument("cron", f"expected a 5-field cron expression, got {cron!r}")
        expr = " ".join(cron.split())
        if len(expr.split(" ")) != 5:
            raise InvalidArgument(
                "cron",
                f"expected 5 fields (minute hour day month weekday), got {cron!r}",
            )
        try:
            CronSim(expr, datetime(2000, 1, 1, tzinfo=UTC))
        except CronSimError as error:
            raise InvalidArgument(
                "cron", f"{cron!r} is not a valid cron expression: {error}"
            ) from None
        return Rule(cron=expr, every=None, tz=_zone_name(tz))
    if isinstance(every, bool) or not isinstance(every, timedelta | int | float):
        raise InvalidArgument("every", f"expected a timedelta or seconds, got {every!r}")
    if isinstance(every, float) and not math.isfinite(every):
        raise InvalidArgument("every", f"expected a finite number of seconds, got {every!r}")
    try:
        interval = every if isinstance(every, timedelta) else timedelta(seconds=every)
    except OverflowError:
        interval = MAX_EVERY * 2  # refused just below, with the same message
    if interval < timedelta(seconds=1):
        raise InvalidArgument("every", f"must be at least one second, got {every!r}")
    if interval > MAX_EVERY:
        # Its ticks would fall past the calendar's end (year 9999) or so far off that
        # computing them overflows: a mistake, not a schedule.
        raise InvalidArgument(
            "every", f"must be at most {MAX_EVERY.days} days (100 years), got {every!r}"
        )
    if _zone_name(tz) != "UTC":
        raise InvalidArgument(
            "tz",
            f"an every= interval ticks by elapsed time, the same in every zone, so "
            f"tz={tz!r} would change nothing; use cron='...' for times of day in a zone",
        )
    return Rule(cron=None, every=interval, tz="UTC")


def make_spec(
    id: Any, job_name: Any, rule: Rule, payload: Any, catch_up: Any
) -> RecurringSpec:
    """A validated declaration (the payload is checked by the caller's JSON rules)."""
    if not isinstance(id, str) or not ID_PATTERN.fullmatch(id):
        raise InvalidArgument(
            "id",
            "expected 1-200 letters, digits, '.', '_' or '-' (starting with a letter or "
            f"digit), got {id!r}",
        )
    if not isinstance(job_name, str) or not job_name:
        raise InvalidArgument("job_name", f"expected a job name string, got {job_name!r}")
    if catch_up not in CATCH_UP_POLICIES:
        raise InvalidArgument(
            "catch_up", f"expected one of {', '.join(CATCH_UP_POLICIES)}, got {catch_up!r}"
        )
    return RecurringSpec(id=id, job_name=job_name, rule=rule, payload=payload, catch_up=catch_up)


def plan(
    rule: Rule, next_tick: datetime, now: datetime, catch_up: CatchUp, max_catch_up: int
) -> Plan:
    """Which ticks from *next_tick* up to *now* become jobs, and the tick after them.

    Ticks less than :data:`ON_TIME` old always run. Older (missed) ticks follow the
    policy: ``latest`` runs the most recent missed tick once, and only when no on-time
    tick runs; ``skip`` runs none; ``all`` runs every one. No policy writes more than
    *max_catch_up* ticks at once (the newest are kept).
    """
    if next_tick > now:
        return Plan((), next_tick)
    latest = rule.last_at_or_before(now)
    if latest < next_tick:
        # The stored tick is not one of this rule's (the rule changed): start afresh.
        return Plan((), rule.first_at_or_after(now))
    chosen: list[datetime] = []
    tick = latest
    truncated = False
    while tick >= next_tick:
        if len(chosen) >= max_catch_up:
            truncated = True
            break
        on_time = now - tick < ON_TIME
        if on_time or catch_up == "all" or (catch_up == "latest" and not chosen):
            chosen.append(tick)
        if not on_time and catch_up != "all":
            break  # every older tick is missed too, and the policy runs none of them
        tick = rule.previous_before(tick)
    return Plan(tuple(reversed(chosen)), rule.next_after(latest), truncated)


def tick_key(schedule_id: str, tick: datetime) -> str:
    """The job key of one tick: ``recurring:<id>:<tick time in UTC, ISO 8601>``."""
    return f"recurring:{schedule_id}:{as_utc(tick, 'tick').isoformat().replace('+00:00', 'Z')}"


def _zone_name(tz: Any) -> str:
    _zone(tz)
    return str(tz)


def _zone(tz: Any) -> ZoneInfo:
    if not isinstance(tz, str) or not tz:
        raise InvalidArgument("tz", f"expected an IANA time zone name, got {tz!r}")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidArgument(
            "tz", f"unknown time zone {tz!r}; use an IANA name such as 'Europe/Berlin'"
        ) from None
