"""The job as the rest of the program sees it: an immutable snapshot of one row.

A :class:`Job` is a value, not an active record: changing a job always goes through
the facade (``defer.cancel``, ``defer.reschedule`` ...), so every change is one guarded
statement with one set of race rules. :class:`NotYet` and :class:`RetryAfter` are the
two ways a handler tells the worker "not now".
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import MISSING, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .errors import InvalidArgument
from .timeutil import Duration, as_duration, as_utc, utcnow


class JobStatus(enum.StrEnum):
    """Where a job is in its life: ``pending → running → done | failed``, or ``cancelled``.

    ``expired``: a pending job not started by its ``expires_at`` (it never ran).
    """

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def is_live(self) -> bool:
        """True while the job may still run (pending or running): its key is taken."""
        return self in (JobStatus.PENDING, JobStatus.RUNNING)

    @property
    def is_settled(self) -> bool:
        """True once nothing will happen to the job any more."""
        return not self.is_live


#: The Undo toast's texts for its states after "open", each in its own column.
STATE_TEXTS = ("waiting_label", "done_label", "failed_label", "undone_label")


@dataclass(frozen=True, slots=True)
class Job:
    """A snapshot of one ``defer_jobs`` row, as handlers and callers receive it.

    ``run_at`` is when the job is (next) due; ``due_at`` is when it first became due,
    which a retry's backoff does not move, so "how long has this been owed" stays true.
    ``attempts`` counts runs started, including the current one inside a handler.
    """

    id: int
    name: str
    payload: Any
    status: JobStatus
    run_at: datetime
    due_at: datetime
    attempts: int
    max_attempts: int
    queue: str
    key: str | None = None
    owner: str | None = None
    label: str | None = None
    undo_until: datetime | None = None
    last_error: str | None = None
    result: Any = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None
    claim_token: str | None = None
    lease_expires_at: datetime | None = None
    #: The toast's texts for its other states (``defer.undoable(done_label=...)``).
    waiting_label: str | None = None
    done_label: str | None = None
    failed_label: str | None = None
    undone_label: str | None = None
    #: Queue controls: due jobs are claimed by priority (lower first) then run_at; at
    #: most ``concurrency_limit`` jobs of one ``concurrency_key`` run at once; a job not
    #: started by ``expires_at`` settles as expired.
    priority: int = 0
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    expires_at: datetime | None = None
    #: How many of its parents (``schedule(..., after=...)``) have not settled yet; None
    #: when it waits for none, so a claim may take it once due.
    waiting_for: int | None = None
    #: Who asked to abort this running job (``defer.abort``); None when nobody did.
    abort_requested_by: str | None = None
    #: A rate-limited handler's limit (``@defer.job(rate_limit="10/s")``): at most
    #: ``rate_limit`` jobs of its bucket (its ``concurrency_key``) start per
    #: ``rate_period`` seconds, across every worker. None for other jobs.
    rate_limit: int | None = None
    rate_period: float | None = None
    #: The W3C trace context (``traceparent``, ``tracestate``) of the span that
    #: scheduled it, with OpenTelemetry (``flask_defer.tracing``); None otherwise.
    trace_context: dict[str, str] | None = None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> Job:
        """Build a job from a mapping of column values (as the store returns them)."""
        values = {name: row[name] for name in cls.__slots__ if name in row}
        values["status"] = JobStatus(values["status"])
        return cls(**values)

    @classmethod
    def builder(
        cls,
        keys: Sequence[str],
        *,
        to_utc: Collection[str] = (),
        convert: Mapping[str, Callable[[Any], Any]] | None = None,
    ) -> Callable[[Sequence[Any]], Job]:
        """A fast :meth:`from_row` for many rows of one result: *keys* are its columns.

        The column positions are worked out once, and each job's slots are filled
        directly rather than through the frozen dataclass's ``__init__`` (measured: 1.8
        against 5.2 µs a job), since the worker's claim builds a job per claimed row on
        its hot path. Columns named in *to_utc* hold aware datetimes (or None) that are
        turned to UTC, for rows read without SQLAlchemy's result types; *convert* maps a
        column to the function that reads its stored value (None stays None), for rows
        read without SQLAlchemy's result processing.
        """
        at = {key: i for i, key in enumerate(keys)}
        if "status" not in at:
            raise ValueError("a job's row needs its status column")
        plain: list[tuple[Callable[[Job, Any], None], int]] = []
        aware: list[tuple[Callable[[Job, Any], None], int]] = []
        converted: list[tuple[Callable[[Job, Any], None], int, Callable[[Any], Any]]] = []
        readers = convert or {}
        defaults: list[tuple[Callable[[Job, Any], None], Any]] = []
        for name in cls.__slots__:
            if name == "status":
                continue
            slot = cls.__dict__[name].__set__
            if name not in at:
                field = cls.__dataclass_fields__[name]
                if field.default is MISSING:
                    raise ValueError(f"a job's row needs its {name} column")
                defaults.append((slot, field.default))
            elif name in to_utc:
                aware.append((slot, at[name]))
            elif name in readers:
                converted.append((slot, at[name], readers[name]))
            else:
                plain.append((slot, at[name]))
        set_status = cls.__dict__["status"].__set__
        status_at = at["status"]
        new = object.__new__

        def build(row: Sequence[Any]) -> Job:
            job = new(cls)
            for slot, i in plain:
                slot(job, row[i])
            for slot, i in aware:
                value = row[i]
                slot(job, None if value is None else value.astimezone(UTC))
            for slot, i, read in converted:
                value = row[i]
                slot(job, None if value is None else read(value))
            for slot, default in defaults:
                slot(job, default)
            set_status(job, JobStatus(row[status_at]))
            return job

        return build

    @property
    def is_live(self) -> bool:
        """True while the job is pending or running."""
        return self.status.is_live

    def abort_requested(self) -> bool:
        """In a handler: True once someone asked to abort this run (``defer.abort``).

        The worker learns of the request within one heartbeat (``ABORT_CHECK_SECONDS``)
        and this answers from memory, so call it as often as you like. End by raising
        :class:`Aborted` (or by returning): the job settles ``cancelled`` with an
        ``aborted`` history event naming who asked. A handler that never asks runs to
        its end, and its outcome stands.
        """
        return ABORTS.seen(self.id, self.claim_token)

    def undo_seconds_left(self, now: datetime | None = None) -> float:
        """Seconds the owner may still undo this job (0 when it is not undoable now)."""
        if self.undo_until is None or self.status is not JobStatus.PENDING:
            return 0.0
        left = (self.undo_until - (now or utcnow())).total_seconds()
        return max(left, 0.0)


class NotYet(Exception):  # noqa: N818 - the name reads as the handler's answer
    """Raised by a handler to run the job again at ``until`` without spending an attempt.

    Use it when the job is fine but the world is not ready: a booking that is not yet
    confirmed, a rate-limited API that says "come back at 10:00". ``until`` is an aware
    datetime in the future, or a delay (timedelta or seconds) from now.
    """

    until: datetime
    #: The delay when one was given; the worker measures it from its own clock.
    delay: timedelta | None

    def __init__(self, until: datetime | Duration) -> None:
        now = utcnow()
        if isinstance(until, datetime):
            when = as_utc(until, "until")
            if when <= now:
                raise InvalidArgument(
                    "until", f"{when.isoformat()} is not in the future; NotYet needs a later time"
                )
            self.delay = None
        else:
            self.delay = as_duration(until, "until", allow_zero=False)
            when = now + self.delay
        super().__init__(f"not yet; run again at {when.isoformat()}")
        self.until = when

    def resume_at(self, now: datetime) -> datetime:
        """When to run again, measured from the executor's *now* for a relative delay."""
        return now + self.delay if self.delay is not None else self.until


class Aborted(Exception):  # noqa: N818 - the name reads as the handler's answer
    """Raised by a handler that stops because :meth:`Job.abort_requested` said so.

    The job settles ``cancelled`` (not retried), with an ``aborted`` history event
    naming who asked for the abort; the exception's text, if any, is its ``last_error``.
    """


#: How often (seconds) a worker, or ``run_due``, looks for abort requests of the jobs
#: it is running: the longest a handler waits to see ``abort_requested()`` turn True.
ABORT_CHECK_SECONDS = 0.5


class AbortRequests:
    """The runs (job id, claim token) that someone asked to abort, as this process knows.

    The heartbeat that renews leases (``engine.leases``) fills it; :meth:`Job.
    abort_requested` reads it, and remembers that the handler saw the request, so
    a handler that returns after seeing it ends the job as aborted too. Keyed by the
    claim token: a request is for one run, never for a later claim of the same job.
    """

    def __init__(self) -> None:
        self._requested: set[tuple[int, str | None]] = set()
        self._seen: set[tuple[int, str | None]] = set()

    def request(self, job_id: int, token: str | None) -> None:
        self._requested.add((job_id, token))

    def requested(self, job_id: int, token: str | None) -> bool:
        """Whether this run's abort was requested (whether or not the handler looked)."""
        return (job_id, token) in self._requested

    def seen(self, job_id: int, token: str | None) -> bool:
        """:meth:`requested`, remembering that the handler was told."""
        if (job_id, token) not in self._requested:
            return False
        self._seen.add((job_id, token))
        return True

    def was_seen(self, job_id: int, token: str | None) -> bool:
        return (job_id, token) in self._seen

    def forget(self, job_id: int, token: str | None) -> None:
        """The run ended: its entries go (set operations are atomic under the GIL)."""
        self._requested.discard((job_id, token))
        self._seen.discard((job_id, token))


#: This process's abort requests (one per process, like the worker's own threads).
ABORTS = AbortRequests()


class RetryAfter(Exception):  # noqa: N818 - the name reads as the handler's answer
    """Raised by a handler to retry after ``seconds`` instead of the default backoff.

    Unlike :class:`NotYet` this spends an attempt: the run failed, and the handler
    knows when trying again is worth it (an HTTP ``Retry-After`` header, say).
    """

    delay: timedelta

    def __init__(self, seconds: Duration, reason: str | None = None) -> None:
        self.delay = as_duration(seconds, "seconds")
        super().__init__(reason or f"retry after {self.delay.total_seconds():g} s")


class Fail(Exception):  # noqa: N818 - the name reads as the handler's answer
    """Raised by a handler to fail the job now, without the retries it has left.

    For errors that another attempt cannot fix: a 404 from an API, a payload that
    names a row that will never exist. The job becomes a dead letter at once, with
    this exception's text as its ``last_error``.
    """


#: The longest excerpt of a result a ``done`` event shows (see :class:`JobEvent`).
RESULT_EXCERPT_CHARS = 200


def result_excerpt(result: Any) -> str | None:
    """A done job's result as one bounded line of JSON ("…" when cut), or None."""
    if result is None:
        return None
    text = json.dumps(result, ensure_ascii=False, default=str)
    return text if len(text) <= RESULT_EXCERPT_CHARS else text[:RESULT_EXCERPT_CHARS] + "…"


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One state change of a job, as ``defer.history(job_id)`` returns it (oldest first).

    ``event`` is one of ``scheduled``, ``replaced``, ``rescheduled``, ``started``,
    ``done``, ``retried``, ``snoozed``, ``failed``, ``cancelled``, ``undone``,
    ``reclaimed``, ``run_now``, ``retried_by_operator``, ``expired``, ``released`` (its
    last parent settled), ``abort_requested`` and ``aborted``. ``actor`` says who caused it:
    the owner for an undo, the operator for a dashboard action, ``cli``,
    ``worker:<host>:<pid>``, or ``app`` (a Python call without ``actor=``).
    ``attempt`` is the job's attempt count at that moment; ``error`` is the failed
    attempt's error (``retried``, ``failed``) or why a lease was reclaimed; ``run_at``
    is when the job was due after the change, where it set one. ``result_excerpt`` is,
    on a ``done`` event, the start of the job's result as JSON (at most
    :data:`RESULT_EXCERPT_CHARS` characters), so the timeline says what happened.
    """

    event: str
    at: datetime
    actor: str
    attempt: int
    error: str | None = None
    run_at: datetime | None = None
    result_excerpt: str | None = None


@dataclass(frozen=True, slots=True)
class Group:
    """What ``defer.group(...)`` scheduled: members that run in parallel, and the
    ``then`` job that runs once after the last of them settles.

    ``id`` is the ``then`` job's id: the group is known by its callback, whose
    ``defer.parents(job)`` are the members (the dashboard's job page lists them).
    """

    id: int
    jobs: tuple[Job, ...]
    then_job: Job
