"""The exceptions of flask_defer.

Every error the library raises on purpose derives from :class:`DeferError`, so an
application can catch them all in one place. Core errors are plain exceptions, not
HTTP exceptions: the web layer maps them to status codes and the CLI to exit codes.
Specific context (job id, key, status) travels as attributes, not only in the text.
"""

from __future__ import annotations

from typing import Any


class DeferError(Exception):
    """Base class of every error raised by flask_defer."""

    def __init__(self, message: str | None = None, **context: Any) -> None:
        # The docstring's first line is the default message, so a bare raise still
        # says something useful.
        if message is None:
            message = (type(self).__doc__ or type(self).__name__).strip().splitlines()[0]
        super().__init__(message)
        self.message = message
        for name, value in context.items():
            setattr(self, name, value)


class InvalidArgument(DeferError, ValueError, TypeError):
    """An argument had the wrong type or value; the message names the argument."""

    argument: str

    def __init__(self, argument: str, problem: str) -> None:
        super().__init__(f"{argument}: {problem}", argument=argument)


class JobExists(DeferError):
    """A live (pending or running) job already holds this key."""

    key: str
    existing_id: int | None

    def __init__(self, key: str, existing_id: int | None = None) -> None:
        super().__init__(
            f"a live job already holds key {key!r}"
            + (f" (job {existing_id})" if existing_id is not None else "")
            + "; pass replace=True to swap a pending one",
            key=key,
            existing_id=existing_id,
        )


class JobNotFound(DeferError, LookupError):
    """No job matches the given id or key."""

    job_id: int | None
    key: str | None

    def __init__(self, job_id: int | None = None, key: str | None = None) -> None:
        what = f"id {job_id}" if job_id is not None else f"key {key!r}"
        super().__init__(f"no job with {what}", job_id=job_id, key=key)


class JobNotPending(DeferError):
    """The job is no longer waiting, so it cannot be changed."""

    job_id: int
    status: str
    #: The status the call needed: ``pending``, or ``failed`` for ``retry()``.
    expected: str

    def __init__(self, job_id: int, status: str, expected: str = "pending") -> None:
        why = (
            "only a waiting job can be changed"
            if expected == "pending"
            else f"only a {expected} job can be retried"
        )
        super().__init__(
            f"job {job_id} is {status}, not {expected}; {why}",
            job_id=job_id,
            status=status,
            expected=expected,
        )


class UnknownJob(DeferError, LookupError):
    """No handler is registered under this job name."""

    name: str

    def __init__(self, name: str) -> None:
        super().__init__(
            f"no handler is registered for job {name!r}; "
            f"decorate a function with @defer.job({name!r}) before scheduling it",
            name=name,
        )


class NotConfigured(DeferError, RuntimeError):
    """flask_defer is used before it was set up for this app (did you forget init_app?)."""


class SchemaMismatch(DeferError):
    """The database's flask_defer schema does not match this code; upgrade it first."""

    #: The :class:`~flask_defer.store.versioning.SchemaStatus` that was found.
    status: Any

    def __init__(self, status: Any) -> None:
        super().__init__(status.message, status=status)


class ManagedByAlembic(DeferError):
    """This database's schema is managed by the app's Alembic migrations, not by flask_defer."""

    #: The command to run instead.
    command: str

    def __init__(self, message: str, command: str) -> None:
        super().__init__(message, command=command)


class ScheduleNotFound(DeferError, LookupError):
    """No recurring schedule has this id."""

    schedule_id: str

    def __init__(self, schedule_id: str) -> None:
        super().__init__(
            f"no recurring schedule has the id {schedule_id!r}", schedule_id=schedule_id
        )
