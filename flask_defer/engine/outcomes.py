"""What became of a claimed job: outcomes, run summaries, and errors as logged and stored.

The vocabulary the executor, the worker's pool, its event loop and its flusher share,
kept apart from the executor so each of those can name an outcome without the code
that produces it.
"""

from __future__ import annotations

import enum
import json
import logging
import time
import traceback
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy.exc import SQLAlchemyError

from ..errors import InvalidArgument
from ..jobs import Aborted, Fail, Job
from ..store import Ack
from ..validation import payload_text

logger = logging.getLogger("flask_defer")

#: Longest error text kept on a row: a traceback, not a core dump.
MAX_ERROR_CHARS = 8000


class Outcome(enum.StrEnum):
    """What became of one claimed job."""

    DONE = "done"
    RETRIED = "retried"
    FAILED = "failed"
    SNOOZED = "snoozed"  # NotYet: back to pending, attempt not spent
    UNKNOWN = "unknown"  # no handler here: back to pending with a backoff
    LOST = "lost"  # the claim's lease lapsed; another worker owns the job now
    ABORTED = "aborted"  # stopped on an abort request (defer.abort): cancelled


@dataclass
class RunSummary:
    """Counts of what a run did, by outcome; ``ran`` is every job whose outcome was
    written (not one dropped after the database refused it: that job runs again)."""

    ran: int = 0
    counts: dict[str, int] = field(default_factory=lambda: {o.value: 0 for o in Outcome})
    #: True when ``run_due`` stopped claiming at its ``max_seconds``: more may be due.
    out_of_time: bool = False
    #: A burst run's end: due jobs it left, held by something outside it (a paused
    #: queue or name, a concurrency key another worker holds).
    left: int = 0

    def add(self, outcome: Outcome) -> None:
        self.ran += 1
        self.counts[outcome.value] += 1

    def __getattr__(self, name: str) -> int:
        # summary.done, summary.failed ... read like the outcome names.
        counts = self.__dict__.get("counts", {})
        if name in counts:
            return int(counts[name])
        raise AttributeError(name)

    def copy(self) -> RunSummary:
        return RunSummary(self.ran, dict(self.counts), self.out_of_time, self.left)

    def since(self, earlier: RunSummary) -> RunSummary:
        """What ran after *earlier* (a copy of this summary taken then)."""
        counts = {name: n - earlier.counts.get(name, 0) for name, n in self.counts.items()}
        return RunSummary(self.ran - earlier.ran, counts)

    def text(self) -> str:
        """``ran 12 job(s) (done 10, retried 2)``, for the log."""
        parts = [f"{name} {n}" for name, n in self.counts.items() if n]
        text = f"ran {self.ran} job(s)" + (f" ({', '.join(parts)})" if parts else "")
        if self.left:
            text += f"; left {self.left} due job(s) held by a pause or another worker's keys"
        return text

    def as_dict(self) -> dict[str, int]:
        return {"ran": self.ran, **self.counts}


class JobLog(logging.LoggerAdapter[logging.Logger]):
    """Every line about a job names its id, name and key, as text and as record fields."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        job = cast(Job, (self.extra or {})["job"])
        kwargs["extra"] = {"job_id": job.id, "job_name": job.name, "job_key": job.key}
        key = f" key={job.key}" if job.key else ""
        return f"job {job.id} {job.name}{key}: {msg}", kwargs


@dataclass(frozen=True, slots=True)
class PendingAck:
    """A handler's outcome waiting to be written in a batch (see ``Executor.flush``).

    ``settle`` is called after the write with whether the claim still owned the row;
    it logs, sends the signal and returns the :class:`Outcome`.
    """

    ack: Ack
    settle: Callable[[bool], Outcome]
    #: The claimed job (the activity counts read its queue, name and lateness).
    job: Job | None = None
    #: What to write instead when the database refuses this outcome (given its error),
    #: or None to drop it: for a done outcome whose result is past the database's size
    #: limit, the failure that result makes (it would be refused again at every run).
    instead: Callable[[Exception], PendingAck | None] | None = None


def written_alone(
    write: Callable[[PendingAck], Outcome], pending: PendingAck
) -> tuple[Outcome, PendingAck]:
    """*pending* written on its own by *write*, or what stands in for it when the
    database refuses it (:attr:`PendingAck.instead`: a result past the size limit
    fails its job); the outcome, and what was written. A refusal with no stand-in, or
    of the stand-in too, raises: the caller drops that outcome (:data:`DROPPED`)."""
    try:
        return write(pending), pending
    except SQLAlchemyError as error:
        stand_in = pending.instead(error) if pending.instead is not None else None
        if stand_in is None:
            raise
    return write(stand_in), stand_in


#: The log line of an outcome the database refused on its own, given up: its job id and
#: the database's reason.
DROPPED = (
    "could not write the outcome of job %s (%s); dropped: the job runs again when its "
    "lease lapses"
)


def asked_again(
    pending: Sequence[PendingAck], owned: Collection[int], tried: Collection[tuple[int, str]]
) -> list[tuple[Ack, datetime]]:
    """The acks of *pending* written once before (*tried*: job id and claim token) and
    refused now, each with its job's claim time: what ``JobStore.acknowledged_before``
    is asked about."""
    return [
        (p.ack, p.job.updated_at)
        for p in pending
        if (p.ack.job_id, p.ack.claim_token) in tried
        and p.ack.job_id not in owned
        and p.job is not None
        and p.job.updated_at is not None
    ]


#: Longest error text in a log line; the whole traceback is in the job's last_error.
MAX_LOG_ERROR_CHARS = 200


def error_summary(error: BaseException) -> str:
    """An error for one log line: its type and the first line of its message, bounded.

    ``KeyError('message_id')`` prints as ``'message_id'`` alone, and an HTTP error can
    carry a whole HTML page: the line names the type and stays short.
    """
    message = str(error).strip().splitlines()
    first = message[0] if message else ""
    if len(message) > 1:
        first += " …"
    if len(first) > MAX_LOG_ERROR_CHARS:
        first = first[: MAX_LOG_ERROR_CHARS - 1] + "…"
    name = type(error).__name__
    return f"{name}: {first}" if first else name


def error_text(error: BaseException) -> str:
    """An error as stored in ``last_error``: its traceback, storable, bounded."""
    text = "".join(traceback.format_exception(error))
    # A NUL or a lone surrogate in an error message would make PostgreSQL refuse
    # the acknowledgement itself, and the job would wait out its lease.
    text = text.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    if len(text) > MAX_ERROR_CHARS:
        # Keep the end: the innermost frame and the message are what a reader needs.
        text = "…(truncated)\n" + text[-MAX_ERROR_CHARS:]
    return text


def abort_note(error: BaseException | None) -> str | None:
    """The ``last_error`` of an aborted run: :class:`~flask_defer.Aborted`'s text (None
    without one), or the traceback of another error raised after the request."""
    if error is None or isinstance(error, Aborted):
        return (str(error) or None) if error is not None else None
    return error_text(error)


class UnstorableResult(Fail):
    """A handler returned a value the database cannot store; the job fails, once.

    A :class:`Fail`, not a retry: the handler's effects happened, and running it again
    would only return the same value.
    """


def storable(value: Any) -> Any:
    """A handler's return value as stored: JSON, or ``None`` when it is not JSON.

    A JSON value the database cannot store (a NUL or a lone surrogate in a string,
    nesting too deep) raises :class:`UnstorableResult`, which fails the job: without
    this the done mark itself would fail and the job would run a second time.
    """
    if value is None:
        return None
    try:
        json.dumps(value, allow_nan=False)
    except RecursionError:
        pass  # JSON, but too deep: payload_text says so
    except (TypeError, ValueError):
        logger.debug("handler result %r is not JSON; not stored", value)
        return None
    try:
        payload_text(value, "result")
    except InvalidArgument as error:
        raise UnstorableResult(f"the handler's result cannot be stored: {error}") from None
    return value


def duration(seconds: float) -> str:
    """A handler's run time for the log: ``12 ms`` below ten seconds, else ``42.3 s``."""
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


class ProgressLog:
    """Every *interval* seconds, one INFO line of what a worker ran since the last one.

    Each job's success is a DEBUG line (a line per job cost a no-op job as much as the
    rest of its run); an operator at INFO still sees the worker's throughput.
    """

    def __init__(self, log: logging.Logger, interval: float = 60.0) -> None:
        self.log = log
        self.interval = interval
        self._reported = RunSummary()
        self._due = time.monotonic() + interval

    def maybe_log(self, summary: RunSummary) -> None:
        """Log what *summary* gained since the last line, if a line is due."""
        mono = time.monotonic()
        if mono < self._due:
            return
        self._due = mono + self.interval
        now = summary.copy()
        since, self._reported = now.since(self._reported), now
        if since.ran:
            self.log.info("%s in the last %g s", since.text(), self.interval)
