"""A job's queue controls: priority, per-key concurrency limit and expiry, checked once.

``schedule()`` and ``@defer.job(...)`` both take them; what a call leaves out comes
from its handler's registration (``HandlerSpec.controls``), and what that leaves out
from the defaults here
(priority 0, no key, no expiry). The checks name the argument and what was wrong, at
the call, so a bad value never reaches the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .errors import InvalidArgument
from .timeutil import Duration, as_duration, as_utc
from .validation import checked_text, storable_text

#: Priorities run from the most urgent to the least; lower numbers are claimed first.
MIN_PRIORITY = -100
MAX_PRIORITY = 100
#: The most jobs of one concurrency key that may run at once (a sanity bound).
MAX_CONCURRENCY_LIMIT = 10_000


#: A rate limit's periods, in seconds: ``"10/s"``, ``"100/m"``, ``"1000/h"``.
RATE_PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
#: The most starts a rate limit may allow per period (a sanity bound).
MAX_RATE = 100_000
#: A rate-limited job's bucket is its ``concurrency_key``: this prefix, the job name,
#: and its ``rate_key`` when it has one.
RATE_BUCKET_PREFIX = "rate:"


@dataclass(frozen=True, slots=True)
class QueueControls:
    """The stored form: what the row's ``priority`` ... ``expires_at`` columns hold."""

    priority: int = 0
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    expires_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``count`` starts per ``period`` seconds (``@defer.job(rate_limit="10/s")``)."""

    count: int
    period: float

    def text(self) -> str:
        """As it was written: ``10/s``."""
        unit = next(u for u, seconds in RATE_PERIODS.items() if seconds == self.period)
        return f"{self.count}/{unit}"


def checked_rate_limit(value: Any, argument: str = "rate_limit") -> RateLimit | None:
    """``"N/s"``, ``"N/m"`` or ``"N/h"`` (N from 1 to :data:`MAX_RATE`), or None."""
    if value is None:
        return None
    if isinstance(value, RateLimit):
        return value
    if not isinstance(value, str):
        raise InvalidArgument(argument, f"expected a string like '10/s', got {value!r}")
    count, slash, unit = value.strip().partition("/")
    count, unit = count.strip(), unit.strip()
    if not slash or unit not in RATE_PERIODS or not count.isascii() or not count.isdigit():
        raise InvalidArgument(
            argument,
            f"expected N/s, N/m or N/h (starts per second, minute or hour), got {value!r}",
        )
    if not 1 <= int(count) <= MAX_RATE:
        raise InvalidArgument(argument, f"expected 1 to {MAX_RATE:,} per period, got {count}")
    return RateLimit(int(count), RATE_PERIODS[unit])


def rate_bucket(name: str, rate_key: Any) -> str:
    """The bucket a rate-limited job of *name* counts in (checked *rate_key*, or None)."""
    key = checked_text(rate_key, "rate_key")
    bucket = f"{RATE_BUCKET_PREFIX}{name}" + (f":{key}" if key is not None else "")
    if len(bucket) > 255:
        raise InvalidArgument("rate_key", "too long: the job name and rate_key make its bucket")
    return bucket


def validate_queue(queue: object) -> None:
    """A queue name: a non-empty string of at most 100 characters."""
    if not isinstance(queue, str) or not queue or len(queue) > 100:
        raise InvalidArgument("queue", f"expected a non-empty string (≤100 chars), got {queue!r}")
    storable_text(queue, "queue")


def checked_priority(value: Any, argument: str = "priority") -> int:
    """An integer from :data:`MIN_PRIORITY` to :data:`MAX_PRIORITY` (lower runs first)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(argument, f"expected an integer, got {value!r}")
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidArgument(
            argument,
            f"expected {MIN_PRIORITY} to {MAX_PRIORITY} (lower runs first), got {value!r}",
        )
    return value


def checked_concurrency_limit(value: Any, argument: str = "concurrency_limit") -> int:
    """How many jobs of one key may run at once: 1 to :data:`MAX_CONCURRENCY_LIMIT`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(argument, f"expected an integer, got {value!r}")
    if not 1 <= value <= MAX_CONCURRENCY_LIMIT:
        raise InvalidArgument(
            argument, f"expected 1 to {MAX_CONCURRENCY_LIMIT}, got {value!r}"
        )
    return value


def checked_ttl(value: Duration | None, argument: str = "ttl") -> timedelta | None:
    """A positive duration (how late after ``run_at`` a job may still start), or None."""
    return None if value is None else as_duration(value, argument, allow_zero=False)


def resolve_controls(
    *,
    run_at: datetime,
    priority: Any,
    concurrency_key: Any,
    concurrency_limit: Any,
    expires_at: Any,
    ttl: Duration | None,
    default_priority: int = 0,
    default_concurrency_limit: int | None = None,
    default_ttl: timedelta | None = None,
) -> QueueControls:
    """Check one job's controls against its *run_at*; the handler's defaults fill gaps.

    ``ttl`` is measured from ``run_at`` (how late the job may start), ``expires_at`` is a
    moment; one of them at most, and the moment must come after ``run_at``, or the job
    could never run. A ``concurrency_limit`` needs a ``concurrency_key`` to count by;
    a key without one is limited to the handler's limit, else to 1.
    """
    level = default_priority if priority is None else checked_priority(priority)
    key = checked_text(concurrency_key, "concurrency_key")
    limit: int | None = None
    if concurrency_limit is not None:
        limit = checked_concurrency_limit(concurrency_limit)
        if key is None:
            raise InvalidArgument(
                "concurrency_limit",
                "needs a concurrency_key to count running jobs by "
                "(schedule(..., concurrency_key='account:42', concurrency_limit=2))",
            )
    elif key is not None:
        limit = default_concurrency_limit or 1
    if expires_at is not None and ttl is not None:
        raise InvalidArgument("ttl", "give expires_at or ttl, not both")
    until: datetime | None = None
    if expires_at is not None:
        until = as_utc(expires_at, "expires_at")
        if until <= run_at:
            raise InvalidArgument(
                "expires_at",
                f"{until.isoformat()} is not after the job's run_at {run_at.isoformat()}: "
                "the job would expire before it is due",
            )
    else:
        span = checked_ttl(ttl) if ttl is not None else default_ttl
        if span is not None:
            until = run_at + span
    return QueueControls(level, key, limit, until)
