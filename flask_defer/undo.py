"""The values of the Undo feature: what an Undo answered, and what a toast shows.

Undo is a cancel restricted to the job's owner. It can lose the race against the
worker's claim, so it returns an :class:`UndoOutcome` instead of raising: the web layer
renders it, and ``defer.undo()`` callers branch on it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from .jobs import Job, JobStatus

#: The largest id a job can have (a signed 64-bit integer on both backends); larger
#: numbers in a URL are answered "not found" instead of overflowing the driver.
MAX_JOB_ID = 2**63 - 1


class UndoOutcome(enum.StrEnum):
    """What an Undo did; only :attr:`UNDONE` means this request stopped the job."""

    #: The job was pending and is now cancelled: it will not run.
    UNDONE = "undone"
    #: Too late: a worker is running the job right now.
    RUNNING = "running"
    #: Too late: the job already ran (it is done, or it ran and failed).
    ALREADY_RAN = "already_ran"
    #: The job had been cancelled before (a double click, another tab).
    ALREADY_UNDONE = "already_undone"

    @classmethod
    def for_status(cls, status: JobStatus) -> UndoOutcome:
        """The answer for a job that could not be cancelled because it is in *status*."""
        if status is JobStatus.CANCELLED:
            return cls.ALREADY_UNDONE
        if status in (JobStatus.DONE, JobStatus.FAILED):
            return cls.ALREADY_RAN
        # Running, or pending again after a failed attempt raced this Undo.
        return cls.RUNNING

    @property
    def undone(self) -> bool:
        """True when the job will not run (this Undo, or an earlier one, stopped it)."""
        return self in (UndoOutcome.UNDONE, UndoOutcome.ALREADY_UNDONE)

    @property
    def message(self) -> str:
        """A short sentence for the person who clicked Undo."""
        return _MESSAGES[self]

    def describe(self, label: str | None) -> str:
        """The answer as one sentence about the labelled action ("“Message sent” — undone.")."""
        if not label:
            return self.message
        return f"“{label}” — {_CLAUSES[self]}"


_MESSAGES = {
    UndoOutcome.UNDONE: "Undone.",
    UndoOutcome.RUNNING: "Too late — it is running now.",
    UndoOutcome.ALREADY_RAN: "Too late — it already ran.",
    UndoOutcome.ALREADY_UNDONE: "Already undone.",
}

_CLAUSES = {
    UndoOutcome.UNDONE: "undone.",
    UndoOutcome.RUNNING: "too late, it is running now.",
    UndoOutcome.ALREADY_RAN: "too late, it already ran.",
    UndoOutcome.ALREADY_UNDONE: "already undone.",
}


@dataclass(frozen=True, slots=True)
class Toast:
    """One live Undo toast: a pending job of the owner whose window is still open.

    ``seconds_left`` is computed on the server from ``undo_until`` (which is ``run_at``
    minus ``DEFER_UNDO_MARGIN``), so a reload or a navigation shows the true remaining
    time; the browser only counts it down.
    """

    job: Job
    seconds_left: float
    window_seconds: float

    @classmethod
    def from_job(cls, job: Job, now: datetime) -> Toast:
        """The toast of *job* as seen at *now*."""
        assert job.undo_until is not None
        start = job.created_at or now
        window = max((job.undo_until - start).total_seconds(), 0.001)
        return cls(job=job, seconds_left=job.undo_seconds_left(now), window_seconds=window)

    @property
    def id(self) -> int:
        """The job's id, which the Undo URL carries."""
        return self.job.id

    @property
    def label(self) -> str | None:
        """What happened, in the app's words ("Message sent")."""
        return self.job.label

    @property
    def fraction_left(self) -> float:
        """How much of the window remains, from 1 down to 0 (the progress bar)."""
        return min(max(self.seconds_left / self.window_seconds, 0.0), 1.0)
