"""Time helpers: one notion of "now" and one way to turn user input into UTC.

All times inside flask_defer are timezone-aware UTC. Naive datetimes are refused at
the boundary because guessing their zone is how jobs end up running an hour early.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from .errors import InvalidArgument

Duration = timedelta | int | float


def utcnow() -> datetime:
    """The current time as an aware UTC datetime."""
    return datetime.now(UTC)


def as_utc(value: datetime, argument: str) -> datetime:
    """Return *value* in UTC, refusing naive datetimes with an error naming *argument*."""
    if not isinstance(value, datetime):
        raise InvalidArgument(argument, f"expected a timezone-aware datetime, got {value!r}")
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise InvalidArgument(
            argument,
            f"naive datetime {value.isoformat()} has no timezone; "
            "pass an aware datetime such as datetime.now(timezone.utc) + timedelta(...)",
        )
    return value.astimezone(UTC)


def as_duration(value: Duration, argument: str, *, allow_zero: bool = True) -> timedelta:
    """Normalise a timedelta or a number of seconds, refusing negatives and bad types."""
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise InvalidArgument(argument, f"expected a timedelta or seconds, got {value!r}")
    duration = value if isinstance(value, timedelta) else timedelta(seconds=value)
    if duration < timedelta(0) or (not allow_zero and duration == timedelta(0)):
        raise InvalidArgument(
            argument, f"must be {'zero or ' if allow_zero else ''}positive, got {value!r}"
        )
    return duration


def resolve_run_at(
    run_at: datetime | None, delay: Duration | None, now: datetime
) -> datetime:
    """Turn the ``run_at``/``delay`` pair of the public API into a UTC time, never in the past.

    A ``run_at`` in the past is clamped to *now*: the caller meant "as soon as possible",
    and a row due in 1970 would distort every lateness figure.
    """
    if run_at is not None and delay is not None:
        raise InvalidArgument("run_at", "pass either run_at or delay, not both")
    if run_at is not None:
        return max(as_utc(run_at, "run_at"), now)
    if delay is not None:
        return now + as_duration(delay, "delay")
    return now
