"""The values of the Undo feature: what an Undo answered, and what a toast shows.

Undo is a cancel restricted to the job's owner. It can lose the race against the
worker's claim, so it returns an :class:`UndoOutcome` instead of raising: the web layer
renders it, and ``defer.undo()`` callers branch on it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from .jobs import Job, JobEvent, JobStatus
from .validation import DEFAULT_ACTOR

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
    #: Too late: the job expired before it started (its ``expires_at`` passed).
    EXPIRED = "expired"

    @classmethod
    def for_status(cls, status: JobStatus) -> UndoOutcome:
        """The answer for a job that could not be cancelled because it is in *status*."""
        if status is JobStatus.CANCELLED:
            return cls.ALREADY_UNDONE
        if status in (JobStatus.DONE, JobStatus.FAILED):
            return cls.ALREADY_RAN
        if status is JobStatus.EXPIRED:
            return cls.EXPIRED
        # Running, or pending again after a failed attempt raced this Undo.
        return cls.RUNNING

    @property
    def undone(self) -> bool:
        """True when the job will not run (this Undo, or an earlier one, stopped it)."""
        return self in (UndoOutcome.UNDONE, UndoOutcome.ALREADY_UNDONE)

    def describe(self, job: Job | None = None, translate: Translate | None = None) -> str:
        """The answer as one short sentence, built from the job's state texts.

        Gmail's wording: "Sending undone." (the job's ``undone_label``), "Too late —
        already sent." (from its ``done_label``), "Too late — couldn't send." for a job
        that failed (from its ``failed_label``); neutral sentences otherwise. Never a
        quoted label inside a sentence. *translate* is the web layer's gettext.
        """
        t = translate or _identity
        if self is UndoOutcome.UNDONE:
            return (job.undone_label if job is not None else None) or t("Undone.")
        if self is UndoOutcome.ALREADY_UNDONE:
            return t("Already undone.")
        if self is UndoOutcome.RUNNING:
            return t("Too late — it is running now.")
        if self is UndoOutcome.EXPIRED:
            return t("Too late — it expired before it started.")
        if job is not None and job.status is JobStatus.FAILED:
            # It ran and failed for good: its done text ("already sent") would be false.
            if job.failed_label:
                return t("Too late — {failed}.").format(failed=_mid_sentence(job.failed_label))
            return t("Too late — it ran and failed.")
        done = job.done_label if job is not None else None
        if done:
            return t("Too late — already {done}.").format(done=_mid_sentence(done))
        return t("Too late — it already ran.")


#: How long after its window closed an unsettled job still shows a waiting toast (a job
#: retrying with backoff for an hour should not follow its owner from page to page).
WAITING_HORIZON = timedelta(minutes=10)

#: A gettext-like function: message id in, translated text out.
Translate = Callable[[str], str]


def _identity(text: str) -> str:
    return text


def _mid_sentence(text: str) -> str:
    """*text* as it reads inside a sentence: "Sent" → "sent" (an acronym stays "SMS")."""
    text = text.strip().rstrip(".!")
    if len(text) > 1 and text[1].isupper():
        return text
    return text[:1].lower() + text[1:]


class ToastState(enum.StrEnum):
    """What a toast shows; ``data-defer-state`` carries it. Only the server decides it."""

    #: The Undo window is open.
    OPEN = "open"
    #: The window closed and the job has not settled yet (pending for the worker, or
    #: running): shown neutrally ("Sending…"), never as done.
    WAITING = "waiting"
    #: The job ran.
    DONE = "done"
    #: The job failed for good (a dead letter).
    FAILED = "failed"
    #: The job was cancelled (this Undo, another tab, the operator).
    UNDONE = "undone"

    @classmethod
    def of(cls, job: Job, now: datetime) -> ToastState:
        """The state of *job*'s toast at *now*, from its row alone."""
        if job.status is JobStatus.DONE:
            return cls.DONE
        if job.status in (JobStatus.FAILED, JobStatus.EXPIRED):
            return cls.FAILED  # expired: it will never run, which the failed text says
        if job.status is JobStatus.CANCELLED:
            return cls.UNDONE
        if job.undo_seconds_left(now) > 0:
            return cls.OPEN
        return cls.WAITING

    @property
    def settled(self) -> bool:
        """True once the toast's text is final (done, failed, undone)."""
        return self in (ToastState.DONE, ToastState.FAILED, ToastState.UNDONE)


def _last_cancel(events: Sequence[JobEvent]) -> JobEvent | None:
    """The event that cancelled the job: ``undone``, ``cancelled`` or ``replaced``."""
    for event in reversed(events):
        if event.event in ("undone", "cancelled", "replaced"):
            return event
    return None


def was_replaced(events: Sequence[JobEvent]) -> bool:
    """True when the job was cancelled by a newer job of its key (``replace=True``):
    its toast must not say the owner undid it, since the newer job will run."""
    last = _last_cancel(events)
    return last is not None and last.event == "replaced"


def cancelling_operator(events: Sequence[JobEvent]) -> str | None:
    """Who cancelled the job, from its history, when that was an operator; else None.

    None when the owner undid it (``undone``), when the app's own code cancelled it
    (actor ``app``), or when nothing says (no cancel recorded, ``DEFER_HISTORY`` off).
    """
    last = _last_cancel(events)
    if last is None or last.event != "cancelled" or last.actor == DEFAULT_ACTOR:
        return None
    return last.actor


def state_text(
    job: Job,
    state: ToastState,
    translate: Translate | None = None,
    *,
    operator: str | None = None,
    replaced: bool = False,
) -> str:
    """The toast's text in *state*: the job's own text for it, else a neutral default.

    No default claims an outcome before the server knows it: an unlabelled open toast
    reads "Action scheduled", a waiting one "In progress…"; "Done" only ever comes from
    a row that is done. A job an *operator* cancelled (see :func:`cancelling_operator`)
    reads "Cancelled by an operator.", never the owner's "Sending undone.": the owner
    did nothing. A job *replaced* by a newer one of its key reads "Replaced by a newer
    request." (see :func:`was_replaced`).
    """
    t = translate or _identity
    if state is ToastState.UNDONE and operator is not None:
        return t("Cancelled by an operator.")
    if state is ToastState.UNDONE and replaced:
        return t("Replaced by a newer request.")
    if state is ToastState.OPEN:
        return job.label or t("Action scheduled")
    if state is ToastState.WAITING:
        return job.waiting_label or t("In progress…")
    if state is ToastState.DONE:
        return job.done_label or t("Done.")
    if state is ToastState.FAILED:
        return job.failed_label or t("Failed.")
    return job.undone_label or t("Undone.")


def announcement(job: Job, translate: Translate | None = None) -> str:
    """What a screen reader hears when the toast appears: what happened, how to undo."""
    t = translate or _identity
    label = state_text(job, ToastState.OPEN, translate).strip()
    if label and label[-1] not in ".!?…":
        label += "."
    return t("{label} Press Z to undo.").format(label=label)


@dataclass(frozen=True, slots=True)
class Toast:
    """One Undo toast: an owner's job whose window is open or just closed.

    ``seconds_left`` is computed on the server from ``undo_until`` (which is ``run_at``
    minus ``DEFER_UNDO_MARGIN``), so a reload or a navigation shows the true remaining
    time; the browser only counts it down. ``state`` is the server's, too.
    """

    job: Job
    seconds_left: float
    window_seconds: float
    state: ToastState = ToastState.OPEN

    @classmethod
    def from_job(cls, job: Job, now: datetime) -> Toast:
        """The toast of *job* as seen at *now*."""
        assert job.undo_until is not None
        start = job.created_at or now
        window = max((job.undo_until - start).total_seconds(), 0.001)
        return cls(
            job=job,
            seconds_left=job.undo_seconds_left(now),
            window_seconds=window,
            state=ToastState.of(job, now),
        )

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
