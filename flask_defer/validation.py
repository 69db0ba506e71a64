"""Argument checks shared by the facade's methods, each naming the argument it refuses."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from .errors import InvalidArgument
from .jobs import JobStatus


def identity(job_id: Any, key: Any) -> tuple[int | None, str | None]:
    """Validate the "id or key" pair that several facade methods take."""
    if (job_id is None) == (key is None):
        raise InvalidArgument("id", "give exactly one of id or key=")
    if job_id is not None and (isinstance(job_id, bool) or not isinstance(job_id, int)):
        raise InvalidArgument("id", f"expected an integer job id, got {job_id!r}")
    return job_id, checked_text(key, "key")


def checked_text(value: Any, argument: str, *, allow_empty: bool = False) -> str | None:
    """An optional short string (a key, owner, label, name): ≤ 255 characters."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(argument, f"expected a string, got {type(value).__name__} {value!r}")
    if not value and not allow_empty:
        raise InvalidArgument(argument, "must not be empty")
    if len(value) > 255:
        raise InvalidArgument(argument, f"at most 255 characters, got {len(value)}")
    return value


def checked_limit(limit: Any) -> int:
    """A page size: an integer from 1 to 10,000."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
        raise InvalidArgument("limit", f"expected an integer from 1 to 10000, got {limit!r}")
    return limit


def checked_payload(payload: Any) -> Any:
    """Refuse what JSON cannot carry before anything is written; return the stored form."""
    if payload is None:
        return {}
    try:
        text = json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise InvalidArgument("payload", f"must be JSON-serialisable: {error}") from None
    # Round-trip so the caller's Job shows exactly what the handler will receive.
    return json.loads(text)


def statuses(
    status: JobStatus | str | Iterable[JobStatus | str] | None,
) -> tuple[JobStatus, ...] | None:
    """One status or several, as JobStatus values (None: any status)."""
    if status is None:
        return None
    items = [status] if isinstance(status, str) else list(status)
    try:
        return tuple(JobStatus(item) for item in items)
    except ValueError:
        allowed = ", ".join(s.value for s in JobStatus)
        raise InvalidArgument("status", f"expected one of {allowed}, got {status!r}") from None


#: Who a Python call is in the job history when it passes no ``actor=``.
DEFAULT_ACTOR = "app"


def checked_actor(actor: Any) -> str:
    """Who made a change, for its history event: ``app`` unless the caller says."""
    return checked_text(actor, "actor") or DEFAULT_ACTOR
