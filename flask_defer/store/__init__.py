"""Every SQL statement of flask_defer, for SQLite and PostgreSQL, and nothing of Flask.

The store is driven with a bare SQLAlchemy engine, so it can be tested and benchmarked
without an app. Statements that must be atomic are single guarded statements
(``UPDATE ... WHERE status = 'pending'``), never a read followed by a write: that is
what makes "the user's cancel wins or the worker's claim wins, never both" true.

Methods that take a ``conn`` run inside the caller's transaction (so scheduling can
join the application's ``db.session``); the others open a short transaction of their
own. All times are passed in (``now=``) so tests can drive the clock.
"""

from __future__ import annotations

from .activity import ActivityBucket, ActivityStatements
from .batches import BatchStatements
from .claims import ClaimStatements
from .control_statements import ControlStatements
from .driver import Driver, driver_class
from .pause_statements import PauseStatements
from .rates import RateStatements
from .read_statements import ReadStatements
from .records import (
    NOTIFY_CHANNEL,
    SCHEDULED_COUNT_CAP,
    SETTLED_COUNT_CAP,
    UNKNOWN_HANDLER_NOTE,
    Ack,
    BatchAppend,
    HistoryEvent,
    JobFilter,
    NewJob,
    Pause,
    QueueCounts,
    StatusCounts,
    WorkerInfo,
)
from .scheduling import SchedulingStatements
from .upkeep import UpkeepStatements
from .workers import WorkerStatements

__all__ = [
    "NOTIFY_CHANNEL",
    "SCHEDULED_COUNT_CAP",
    "SETTLED_COUNT_CAP",
    "UNKNOWN_HANDLER_NOTE",
    "Ack",
    "ActivityBucket",
    "BatchAppend",
    "Driver",
    "HistoryEvent",
    "JobFilter",
    "JobStore",
    "NewJob",
    "Pause",
    "QueueCounts",
    "StatusCounts",
    "WorkerInfo",
    "driver_class",
]


class JobStore(
    SchedulingStatements,
    ControlStatements,
    BatchStatements,
    ReadStatements,
    ClaimStatements,
    UpkeepStatements,
    PauseStatements,
    RateStatements,
    WorkerStatements,
    ActivityStatements,
):
    """All reads and writes of the jobs table, over one engine.

    Split by who calls it (callers' inserts, control writes and batch appends;
    reads; the worker's claims, acknowledgements and upkeep; paused queues and names;
    dependencies; rate-limit starts; live workers; activity)
    only to keep each file readable; it is one object and one owner of all SQL.
    """
