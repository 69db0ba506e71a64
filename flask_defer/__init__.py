"""flask_defer: durable, cancellable delayed jobs for Flask.

The intent lives as a row in the app's own database; a worker runs it when it is due;
Undo is a guarded update that wins or loses cleanly against the worker's claim.
"""

from __future__ import annotations

from .engine.execution import Outcome, RunSummary
from .errors import (
    DeferError,
    InvalidArgument,
    JobExists,
    JobNotFound,
    JobNotPending,
    ManagedByAlembic,
    NotConfigured,
    ScheduleNotFound,
    SchemaMismatch,
    UnknownJob,
)
from .extension import Defer
from .features.batching import Batched
from .features.http_signing import Secret, secret
from .features.soft_delete import INCLUDE_DELETED, RestoreOutcome, SoftDeleteMixin
from .jobs import Aborted, Fail, Group, Job, JobEvent, JobStatus, NotYet, RetryAfter
from .operations.bulk import JobSpec
from .operations.health import Health
from .operations.visibility import Reason
from .signals import (
    job_cancelled,
    job_expired,
    job_failed,
    job_scheduled,
    job_started,
    job_succeeded,
    queue_paused,
    queue_resumed,
)
from .store import ActivityBucket, Pause, WorkerInfo
from .store.recurring_statements import ScheduleRow
from .undo import Toast, UndoOutcome

__all__ = [
    "Aborted",
    "ActivityBucket",
    "INCLUDE_DELETED",
    "Batched",
    "Defer",
    "DeferError",
    "Fail",
    "Group",
    "Health",
    "InvalidArgument",
    "Job",
    "JobEvent",
    "JobExists",
    "JobNotFound",
    "JobNotPending",
    "JobSpec",
    "JobStatus",
    "ManagedByAlembic",
    "NotConfigured",
    "NotYet",
    "Outcome",
    "Pause",
    "Reason",
    "RestoreOutcome",
    "RetryAfter",
    "RunSummary",
    "SchemaMismatch",
    "ScheduleNotFound",
    "ScheduleRow",
    "Secret",
    "SoftDeleteMixin",
    "Toast",
    "UndoOutcome",
    "UnknownJob",
    "WorkerInfo",
    "job_cancelled",
    "job_expired",
    "job_failed",
    "job_scheduled",
    "job_started",
    "job_succeeded",
    "queue_paused",
    "queue_resumed",
    "secret",
]
