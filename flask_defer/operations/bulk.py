"""Bulk scheduling: many keyless jobs of one handler in one statement batch.

Scheduling ten thousand reminders one ``schedule()`` at a time costs a round trip and
a ``RETURNING`` row per job; the bulk path validates every item first (so a bad item
writes nothing) and hands the store one ``executemany``. Bulk jobs carry no key: a key
is a claim on "the one live job for this intent", which needs the per-row conflict
handling of ``schedule()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..errors import InvalidArgument
from ..store import NewJob
from ..timeutil import Duration, resolve_run_at
from ..validation import checked_text, payload_text


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job of :meth:`Defer.schedule_many` whose timing, owner or label is its own.

    Fields left ``None`` fall back to the values given to ``schedule_many`` itself.
    """

    payload: Any = None
    run_at: datetime | None = None
    delay: Duration | None = None
    owner: str | None = None
    label: str | None = None


def build_new_jobs(
    items: Iterable[Any],
    *,
    name: str,
    queue: str,
    max_attempts: int,
    now: datetime,
    run_at: datetime | None,
    delay: Duration | None,
    owner: str | None,
    label: str | None,
    max_payload_bytes: int | None = None,
    strict_local_times: bool = False,
    priority: int = 0,
    ttl: timedelta | None = None,
) -> list[NewJob]:
    """Validate every item and return the rows to insert; raise before anything is written.

    An item is a payload, or a :class:`JobSpec`. Errors name the item's position
    (``payloads[3]: ...``, ``payloads[3].run_at: ...``) so the caller can find it in a
    long list. Items are held to the rules of ``schedule()`` (the same validators).
    """
    # Long on purpose: every item is validated by the rules of schedule() before any write.
    if isinstance(items, str | bytes | bytearray | Mapping) or not isinstance(items, Iterable):
        raise InvalidArgument(
            "payloads", f"expected a list of payloads or JobSpec items, got {type(items).__name__}"
        )
    # The call-level defaults are checked once, even for an empty list.
    default_run_at = resolve_run_at(run_at, delay, now, strict=strict_local_times)
    default_owner = checked_text(owner, "owner")
    default_label = checked_text(label, "label")
    jobs: list[NewJob] = []
    expires_at = default_run_at + ttl if ttl is not None else None
    for index, item in enumerate(items):
        try:
            if isinstance(item, JobSpec):
                timed = item.run_at is not None or item.delay is not None
                payload, text = _validated_payload(item.payload, max_payload_bytes)
                when = (
                    resolve_run_at(item.run_at, item.delay, now, strict=strict_local_times)
                    if timed
                    else default_run_at
                )
                jobs.append(
                    NewJob(
                        name=name,
                        payload=payload,
                        payload_json=text,
                        run_at=when,
                        max_attempts=max_attempts,
                        queue=queue,
                        owner=checked_text(item.owner, "owner") or default_owner,
                        label=checked_text(item.label, "label") or default_label,
                        priority=priority,
                        expires_at=when + ttl if ttl is not None else None,
                    )
                )
            else:
                payload, text = _validated_payload(item, max_payload_bytes)
                jobs.append(
                    NewJob(
                        name=name,
                        payload=payload,
                        payload_json=text,
                        run_at=default_run_at,
                        max_attempts=max_attempts,
                        queue=queue,
                        owner=default_owner,
                        label=default_label,
                        priority=priority,
                        expires_at=expires_at,
                    )
                )
        except InvalidArgument as error:
            where = f"payloads[{index}]"
            argument = f"{where}.{error.argument}" if isinstance(item, JobSpec) else where
            raise InvalidArgument(argument, _problem(error)) from None
    return jobs


def _validated_payload(payload: Any, max_bytes: int | None) -> tuple[Any, str]:
    """*payload* (``{}`` for None) and its stored JSON text, if JSON can carry it.

    The rule of ``schedule()``, which round-trips the payload through JSON to return
    the Job the handler will get; nothing is returned here, so encoding it (the same
    check, the same stored text) is enough. The text is handed on to the insert, so
    a bulk enqueue encodes each payload once.
    """
    if payload is None:
        payload = {}
    return payload, payload_text(payload, "payload", max_bytes=max_bytes)


def _problem(error: InvalidArgument) -> str:
    text = str(error)
    prefix = f"{error.argument}: "
    return text[len(prefix) :] if text.startswith(prefix) else text
