"""Time helpers: one notion of "now" and one way to turn user input into UTC.

All times inside flask_defer are timezone-aware UTC. Naive datetimes are refused at
the boundary because guessing their zone is how jobs end up running an hour early.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from .errors import InvalidArgument

Duration = timedelta | int | float

#: Longest duration any argument or setting may have. Far beyond any real delay, and
#: short enough that "now + it" stays a datetime both databases store.
MAX_DURATION = timedelta(days=365 * 1000)


def utcnow() -> datetime:
    """The current time as an aware UTC datetime."""
    return datetime.now(UTC)


def as_utc(value: datetime, argument: str, *, strict: bool = False) -> datetime:
    """Return *value* in UTC, refusing naive datetimes with an error naming *argument*.

    A local time that a DST change makes ambiguous (it happens twice) or non-existent
    (the clocks skip it) follows Python's rule: ``fold=0`` picks the first of two
    (the offset before the change) and a skipped time is read with the offset before
    the change, i.e. it lands after the gap. With *strict* (``DEFER_STRICT_LOCAL_TIMES``)
    both are refused instead, so the caller must say which instant it means.
    """
    if not isinstance(value, datetime):
        raise InvalidArgument(argument, f"expected a timezone-aware datetime, got {value!r}")
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise InvalidArgument(
            argument,
            f"naive datetime {value.isoformat()} has no timezone; "
            "pass an aware datetime such as datetime.now(timezone.utc) + timedelta(...)",
        )
    if strict:
        _refuse_dst_edge(value, argument)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        # 9999-12-31 23:00-05:00 is in year 10000 in UTC: no datetime holds it.
        raise InvalidArgument(
            argument, f"{value.isoformat()} is out of range once converted to UTC"
        ) from None


def _refuse_dst_edge(value: datetime, argument: str) -> None:
    """Refuse a wall-clock time that a DST change makes ambiguous or skips."""
    other = value.replace(fold=1 - value.fold)
    if other.utcoffset() == value.utcoffset():
        return
    # The two folds disagree only around a change. The time is real (ambiguous) when
    # both readings survive a round trip through UTC, and skipped when they do not.
    tz = value.tzinfo
    round_trips = [
        (v.astimezone(UTC).astimezone(tz).replace(tzinfo=None) == v.replace(tzinfo=None))
        for v in (value, other)
    ]
    what = "ambiguous (it happens twice" if all(round_trips) else "skipped (it does not exist"
    raise InvalidArgument(
        argument,
        f"{value.replace(tzinfo=None).isoformat()} in {tz} is {what} on a DST change) and "
        "DEFER_STRICT_LOCAL_TIMES is on; pass a UTC datetime or set fold explicitly "
        "in a zone without the change",
    )


def as_duration(value: Duration, argument: str, *, allow_zero: bool = True) -> timedelta:
    """Normalise a timedelta or a number of seconds, refusing negatives and bad types."""
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise InvalidArgument(argument, f"expected a timedelta or seconds, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgument(argument, f"expected a finite number of seconds, got {value!r}")
    try:
        duration = value if isinstance(value, timedelta) else timedelta(seconds=value)
    except OverflowError:
        duration = timedelta.max
    if duration > MAX_DURATION:
        raise InvalidArgument(argument, f"at most {MAX_DURATION.days // 365} years, got {value!r}")
    if duration < timedelta(0) or (not allow_zero and duration == timedelta(0)):
        raise InvalidArgument(
            argument, f"must be {'zero or ' if allow_zero else ''}positive, got {value!r}"
        )
    return duration


def resolve_run_at(
    run_at: datetime | None, delay: Duration | None, now: datetime, *, strict: bool = False
) -> datetime:
    """Turn the ``run_at``/``delay`` pair of the public API into a UTC time, never in the past.

    A ``run_at`` in the past is clamped to *now*: the caller meant "as soon as possible",
    and a row due in 1970 would distort every lateness figure.
    """
    if run_at is not None and delay is not None:
        raise InvalidArgument("run_at", "pass either run_at or delay, not both")
    if run_at is not None:
        return max(as_utc(run_at, "run_at", strict=strict), now)
    if delay is not None:
        return now + as_duration(delay, "delay")
    return now
