"""The ``defer_jobs`` table, defined in the application's own SQLAlchemy metadata.

Over 400 lines because it is every table flask_defer owns (jobs, schedules, history,
pauses, dependencies, rate-limit starts, workers, activity), each with its indexes and
the reason for each: one place to read the schema a revision must reach.

Living in the app's metadata is what lets ``db.create_all()`` and Alembic autogenerate
see the table like any other. The indexes are the ones the hot paths need:

* pending rows by ``run_at``, with ``name``, ``due_at`` and ``status`` beside it
  (partial): the claim and "when is the next job due", and, read from the index alone,
  health's owed and scheduled figures per name;
* the three pending indexes the claim reads (this one and the two by priority) leave
  out a job that waits for its parents (``waiting_for`` set, revision
  ``flask_defer_0011``): it enters them when its last parent settles;
* pending rows that carry an error, by ``name`` (partial, usually tiny: retrying jobs
  and jobs a worker had no handler for): health's "waiting for a handler";
* a partial *unique* index on ``key`` over live rows: one pending-or-running job per
  key, while settled rows keep their key for history;
* running rows by lease expiry (partial): reclaiming crashed workers' jobs;
* live rows by owner (partial): the Undo toasts of one user;
* ``(status, finished_at, name)``: pruning old settled rows, the dashboard's filters,
  and health's per-name failed count and latest-settled window from the index alone;
* the claim's: unkeyed pending rows by ``(priority, run_at, id)`` (its order); pending rows with a
  ``concurrency_key`` by the same, and live keyed rows by ``(concurrency_key, status)``
  (how many of a key run); pending rows with an ``expires_at`` by it (the expiry sweep).
  All partial, so a keyless job without expiry enters only the first.

The indexes of revision ``flask_defer_0005`` carry their last columns (``name``,
``due_at``, ``status``) so health reads no table row: each column a query names must be
in the index for an index-only scan (PostgreSQL) or a covering index (SQLite, which
counts the partial index's own ``status`` as a column the query reads).

Two copies of the table exist on purpose. The one in the app's metadata uses plain
SQLAlchemy types only (``DateTime(timezone=True)``, ``JSON`` with a ``JSONB`` variant), so
a revision that Alembic autogenerates from it applies as generated: a custom type would
render as ``flask_defer.store.schema.UTCDateTime()`` in a file that does not import it. The
store runs its statements on :func:`typed_jobs_table`, a copy with the same DDL whose
timestamps go in and come out aware UTC.

Creating the table through the metadata (``db.create_all()``) records the schema's
revision in the same transaction (the store listens for it, see ``store/versioning.py``),
so a database created either way is known to be at the newest revision.

Beside it, in the same metadata, the history table (``<jobs table>_history``): one row
per state change of a job, written in the transaction of the change, read by job id
and deleted with its job (so its only index is ``(job_id, id)``); and the pauses table
(``<jobs table>_pauses``): one row per paused queue or job name, which the claim reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    false,
)
from sqlalchemy.dialects.postgresql import JSONB

# Re-exported: the store and the revisions have always imported it from here.
from .utc_datetime import UTCDateTime as UTCDateTime

DEFAULT_TABLE_NAME = "defer_jobs"
DEFAULT_SCHEDULES_TABLE_NAME = "defer_schedules"
LIVE_STATUSES = ("pending", "running")


def _payload_type(*, for_queries: bool) -> Any:
    """JSON, stored as JSONB on PostgreSQL.

    The metadata's JSONB clears its ``astext_type`` (a class default): Alembic renders it as
    ``astext_type=Text()`` with no import when it autogenerates against SQLite, so the
    revision fails with ``NameError``. Only the ``->>`` operator uses that attribute and
    only the store (which keeps a full JSONB) queries the table; the DDL is the same.
    """
    jsonb = JSONB()
    if not for_queries:
        jsonb.astext_type = None  # type: ignore[assignment]
    return JSON().with_variant(jsonb, "postgresql")


def define_jobs_table(metadata: MetaData, name: str = DEFAULT_TABLE_NAME) -> Table:
    """Add the jobs table to *metadata* (or return it if it is already there).

    Call it where the app defines its models (``define_jobs_table(db.metadata)``) when
    some process builds the metadata without ``init_app`` (an admin app, a plain Alembic
    ``env.py``): autogenerate then sees the table instead of proposing to drop it.
    """
    # Long on purpose: one table definition with its columns and indexes, in one place.
    if name in metadata.tables:
        return metadata.tables[name]
    # BIGINT on PostgreSQL; on SQLite only INTEGER PRIMARY KEY is the fast rowid alias.
    id_type = BigInteger().with_variant(Integer(), "sqlite")
    payload_type = _payload_type(for_queries=False)
    table = Table(
        name,
        metadata,
        Column("id", id_type, primary_key=True, autoincrement=True),
        Column("name", String(200), nullable=False),
        Column("queue", String(100), nullable=False, server_default="default"),
        Column("key", String(255), nullable=True),
        Column("payload", payload_type, nullable=False),
        Column("status", String(16), nullable=False, server_default="pending"),
        Column("run_at", DateTime(timezone=True), nullable=False),
        Column("due_at", DateTime(timezone=True), nullable=False),
        Column("attempts", Integer, nullable=False, server_default="0"),
        Column("max_attempts", Integer, nullable=False),
        Column("owner", String(255), nullable=True),
        Column("label", String(255), nullable=True),
        # The Undo toast's texts for its other states (revision flask_defer_0004).
        Column("waiting_label", String(255), nullable=True),
        Column("done_label", String(255), nullable=True),
        Column("failed_label", String(255), nullable=True),
        Column("undone_label", String(255), nullable=True),
        Column("undo_until", DateTime(timezone=True), nullable=True),
        Column("last_error", Text, nullable=True),
        Column("result", payload_type, nullable=True),
        Column("claim_token", String(64), nullable=True),
        Column("lease_expires_at", DateTime(timezone=True), nullable=True),
        Column("created_at", DateTime(timezone=True), nullable=False),
        Column("updated_at", DateTime(timezone=True), nullable=False),
        Column("finished_at", DateTime(timezone=True), nullable=True),
        # Queue controls: the claim takes due jobs by priority (lower first, revision
        # flask_defer_0008), at most concurrency_limit running per concurrency_key
        # (flask_defer_0009), and a job not started by expires_at settles as expired
        # (flask_defer_0010).
        Column("priority", Integer, nullable=False, server_default="0"),
        Column("concurrency_key", String(255), nullable=True),
        Column("concurrency_limit", Integer, nullable=True),
        Column("expires_at", DateTime(timezone=True), nullable=True),
        # Dependencies (revision flask_defer_0011): how many of a child's parents have
        # not settled yet (NULL: none, the job may be claimed), and whether a job has
        # children at all, so an acknowledgement looks for them only then.
        Column("waiting_for", Integer, nullable=True),
        Column("dependents", Boolean, nullable=False, server_default=false()),
        # Who asked to abort the running job (revision flask_defer_0012): the worker
        # running it looks for this every heartbeat.
        Column("abort_requested_by", String(255), nullable=True),
        # Rate limits (revision flask_defer_0013): at most rate_limit starts of the
        # job's bucket (its concurrency_key) per rate_period seconds.
        Column("rate_limit", Integer, nullable=True),
        Column("rate_period", Float, nullable=True),
        # The W3C trace context of the span that scheduled it (flask_defer.tracing,
        # revision flask_defer_0015): its run joins that trace.
        Column("trace_context", payload_type, nullable=True),
    )
    c = table.c
    pending = c.status == "pending"
    # A pending job that waits for its parents is in none of the claim's indexes: it
    # costs the claim, its wake-up and health nothing until its last parent settles.
    ready = pending & c.waiting_for.is_(None)
    live = c.status.in_(LIVE_STATUSES)
    running = c.status == "running"
    Index(
        f"ix_{name}_pending_run_at_name",
        c.run_at,
        c.name,
        c.due_at,
        c.status,
        c.waiting_for,
        sqlite_where=ready,
        postgresql_where=ready,
    )
    pending_with_error = pending & c.last_error.is_not(None)
    Index(
        f"ix_{name}_pending_errors",
        c.name,
        sqlite_where=pending_with_error,
        postgresql_where=pending_with_error,
    )
    Index(
        f"uq_{name}_live_key",
        c.key,
        unique=True,
        sqlite_where=live,
        postgresql_where=live,
    )
    Index(
        f"ix_{name}_running_lease",
        c.lease_expires_at,
        sqlite_where=running,
        postgresql_where=running,
    )
    Index(
        f"ix_{name}_live_owner",
        c.owner,
        c.run_at,
        sqlite_where=live,
        postgresql_where=live,
    )
    Index(f"ix_{name}_status_finished_name", c.status, c.finished_at, c.name)
    # The claim's order: unkeyed pending rows by priority then run_at. Keyed rows (a
    # concurrency_key) are claimed apart, by the two keyed indexes: their pending rows in
    # the same order, and their live rows by key (how many of a key are running).
    unkeyed = ready & c.concurrency_key.is_(None)
    Index(
        f"ix_{name}_pending_priority",
        c.priority,
        c.run_at,
        c.id,
        sqlite_where=unkeyed,
        postgresql_where=unkeyed,
    )
    keyed = ready & c.concurrency_key.is_not(None)
    Index(
        f"ix_{name}_keyed_pending",
        c.priority,
        c.run_at,
        c.id,
        sqlite_where=keyed,
        postgresql_where=keyed,
    )
    keyed_live = live & c.concurrency_key.is_not(None)
    Index(
        f"ix_{name}_keyed_live",
        c.concurrency_key,
        c.status,
        sqlite_where=keyed_live,
        postgresql_where=keyed_live,
    )
    expiring = pending & c.expires_at.is_not(None)
    Index(
        f"ix_{name}_pending_expiry",
        c.expires_at,
        sqlite_where=expiring,
        postgresql_where=expiring,
    )
    return table


def typed_jobs_table(table: Table) -> Table:
    """A copy of *table* for the store's statements: aware-UTC timestamps, full JSONB.

    Same name, columns, indexes and DDL; its own metadata carries the original's
    ``info`` (Flask-SQLAlchemy's bind key) so sessions route it to the same engine.
    """
    if table.info.get("flask_defer.typed"):
        return table
    return _typed_copy(table, ("payload", "result", "trace_context"))


def typed_schedules_table(table: Table) -> Table:
    """A copy of the schedules *table* for the store's statements (as
    :func:`typed_jobs_table`): aware-UTC timestamps, full JSONB payload."""
    if table.info.get("flask_defer.typed"):
        return table
    return _typed_copy(table, ("payload",))


def _typed_copy(table: Table, payload_columns: tuple[str, ...]) -> Table:
    info = {k: v for k, v in table.metadata.info.items() if k != "flask_defer.typed"}
    copy = table.to_metadata(MetaData(info=info))
    copy.info["flask_defer.typed"] = True
    for column in copy.columns:
        if isinstance(column.type, DateTime):
            column.type = UTCDateTime()
        elif column.name in payload_columns:
            column.type = _payload_type(for_queries=True)
    return copy


def define_schedules_table(metadata: MetaData, name: str = DEFAULT_SCHEDULES_TABLE_NAME) -> Table:
    """Add the recurring schedules table to *metadata* (or return it if it is there).

    One row per ``defer.recurring(...)`` id. The rule columns (``cron``,
    ``every_seconds``, ``tz``), ``job_name``, ``payload`` and ``catch_up`` are copied
    from the declaration in code at each sync, so a schedule whose declaration was
    removed (``orphaned``) still shows what it was. ``next_run_at`` is the tick the
    next compare-and-set advances from; the partial index on it serves "which
    schedules are due" and "when is the next tick" for live (not paused, not
    orphaned) schedules.

    Plain SQLAlchemy types, like the jobs table (see the module docstring); the store
    runs its statements on :func:`typed_schedules_table`. Revision ``flask_defer_0002``
    creates this table, ``flask_defer_0006`` adds ``declared_at``.
    """
    if name in metadata.tables:
        return metadata.tables[name]
    payload_type = _payload_type(for_queries=False)
    table = Table(
        name,
        metadata,
        Column("id", String(200), primary_key=True),
        Column("job_name", String(200), nullable=False),
        Column("cron", String(200), nullable=True),
        Column("every_seconds", Float, nullable=True),
        Column("tz", String(64), nullable=False, server_default="UTC"),
        Column("payload", payload_type, nullable=True),
        Column("catch_up", String(16), nullable=False, server_default="latest"),
        Column("paused", Boolean, nullable=False, server_default=false()),
        Column("orphaned", Boolean, nullable=False, server_default=false()),
        Column("next_run_at", DateTime(timezone=True), nullable=False),
        Column("last_run_at", DateTime(timezone=True), nullable=True),
        Column("created_at", DateTime(timezone=True), nullable=False),
        Column("updated_at", DateTime(timezone=True), nullable=False),
        # When code declaring this id last synced it (revision flask_defer_0006): what
        # the orphan grace period and health's "undeclared" figure are measured from.
        Column("declared_at", DateTime(timezone=True), nullable=True),
    )
    c = table.c
    active = (c.paused == false()) & (c.orphaned == false())
    Index(
        f"ix_{name}_active_next_run_at",
        c.next_run_at,
        sqlite_where=active,
        postgresql_where=active,
    )
    return table


def history_table_name(jobs_table_name: str) -> str:
    """The name of the history table that belongs to *jobs_table_name*."""
    return f"{jobs_table_name}_history"


def pauses_table_name(jobs_table_name: str) -> str:
    """The name of the paused queues and names table that belongs to *jobs_table_name*."""
    return f"{jobs_table_name}_pauses"


@dataclass(frozen=True)
class SchemaNames:
    """One app's flask_defer tables by name, and whether the app's Alembic migrates them.

    What every schema-revision step needs to know (check, upgrade, the SQL, install),
    passed as one value so a renamed table cannot be forgotten in one call of the chain.
    ``jobs`` and ``schedules`` are ``Defer(table_name=..., schedules_table_name=...)``;
    ``history`` and ``pauses`` always follow ``jobs`` (see :func:`history_table_name`), so
    they are derived rather than stored and can never disagree with it.
    ``app_migrations``: the app runs Alembic itself (Flask-Migrate), so the command to run
    is ``flask db upgrade`` even before its first ``alembic_version`` exists.
    """

    jobs: str = DEFAULT_TABLE_NAME
    schedules: str = DEFAULT_SCHEDULES_TABLE_NAME
    app_migrations: bool = False

    @property
    def history(self) -> str:
        """The job history table's name (``<jobs>_history``)."""
        return history_table_name(self.jobs)

    @property
    def pauses(self) -> str:
        """The paused queues and names table's name (``<jobs>_pauses``)."""
        return pauses_table_name(self.jobs)

    @property
    def activity(self) -> str:
        """The activity aggregate table's name (``<jobs>_activity``)."""
        return activity_table_name(self.jobs)

    @property
    def workers(self) -> str:
        """The live workers table's name (``<jobs>_workers``)."""
        return workers_table_name(self.jobs)

    @property
    def starts(self) -> str:
        """The rate-limit starts table's name (``<jobs>_starts``)."""
        return starts_table_name(self.jobs)

    @property
    def dependencies(self) -> str:
        """The job dependencies table's name (``<jobs>_after``)."""
        return dependencies_table_name(self.jobs)


def define_history_table(metadata: MetaData, jobs_table_name: str = DEFAULT_TABLE_NAME) -> Table:
    """Add the job history table to *metadata* (or return it if it is already there).

    No foreign key to the jobs table: SQLite enforces none unless every connection
    turns them on, and the claim and acknowledgement hot paths should not pay for a
    check on PostgreSQL either. Pruning deletes a job's events in the transaction
    that deletes the job instead.
    """
    name = history_table_name(jobs_table_name)
    if name in metadata.tables:
        return metadata.tables[name]
    id_type = BigInteger().with_variant(Integer(), "sqlite")
    table = Table(
        name,
        metadata,
        Column("id", id_type, primary_key=True, autoincrement=True),
        Column("job_id", BigInteger().with_variant(Integer(), "sqlite"), nullable=False),
        Column("event", String(32), nullable=False),
        Column("at", DateTime(timezone=True), nullable=False),
        Column("actor", String(255), nullable=False),
        Column("attempt", Integer, nullable=False),
        Column("error", Text, nullable=True),
        # When the job is due after this event (scheduled, rescheduled, retried, snoozed).
        Column("run_at", DateTime(timezone=True), nullable=True),
    )
    Index(f"ix_{name}_job", table.c.job_id, table.c.id)
    return table


#: What a pause row's ``kind`` may be: a whole queue, or every job of one name.
PAUSE_KINDS = ("queue", "name")


def define_pauses_table(metadata: MetaData, jobs_table_name: str = DEFAULT_TABLE_NAME) -> Table:
    """Add the paused queues and job names table to *metadata* (or return it if there).

    One row per pause: ``kind`` (``queue`` or ``name``) and ``value``, the primary key,
    so pausing twice is one row and a resume is one guarded DELETE. The claim reads it
    as two ``NOT IN`` subqueries; it holds a handful of rows, so its primary key is all
    the index it needs. Always present (unlike history): the claim names it. Revision
    ``flask_defer_0007`` creates it.
    """
    name = pauses_table_name(jobs_table_name)
    if name in metadata.tables:
        return metadata.tables[name]
    return Table(
        name,
        metadata,
        Column("kind", String(16), primary_key=True),
        # As long as a job name (String(200)); queue names are at most 100.
        Column("value", String(200), primary_key=True),
        Column("paused_at", DateTime(timezone=True), nullable=False),
        Column("actor", String(255), nullable=False),
    )


def dependencies_table_name(jobs_table_name: str) -> str:
    """The name of the job dependencies table that belongs to *jobs_table_name*."""
    return f"{jobs_table_name}_after"


#: What a dependency's ``policy`` may be: the child runs only if every parent is done,
#: or once every parent settled, whatever the outcome.
AFTER_POLICIES = ("done", "settled")


def define_dependencies_table(
    metadata: MetaData, jobs_table_name: str = DEFAULT_TABLE_NAME
) -> Table:
    """Add the job dependencies table to *metadata* (or return it if it is there).

    One row per (child, parent) edge of ``schedule(..., after=...)`` and of a group's
    ``then`` job, with the child's ``policy``. ``open`` is true until the parent
    settles: the settlement closes it with a guarded UPDATE (``... AND open``), so each
    edge lowers its child's ``waiting_for`` exactly once, however many workers settle
    parents at the same moment. The primary key serves "a child's parents"; the index
    on ``(parent_id, child_id)`` serves the release and "a parent's children". No
    foreign keys, for the history table's reason. Revision ``flask_defer_0011``.
    """
    name = dependencies_table_name(jobs_table_name)
    if name in metadata.tables:
        return metadata.tables[name]
    id_type = BigInteger().with_variant(Integer(), "sqlite")
    table = Table(
        name,
        metadata,
        Column("child_id", id_type, primary_key=True),
        Column("parent_id", id_type, primary_key=True),
        Column("policy", String(16), nullable=False, server_default="done"),
        Column("open", Boolean, nullable=False),
    )
    Index(f"ix_{name}_parent", table.c.parent_id, table.c.child_id)
    return table


def starts_table_name(jobs_table_name: str) -> str:
    """The name of the rate-limit starts table that belongs to *jobs_table_name*."""
    return f"{jobs_table_name}_starts"


def define_starts_table(metadata: MetaData, jobs_table_name: str = DEFAULT_TABLE_NAME) -> Table:
    """Add the rate-limit starts table to *metadata* (or return it if it is there).

    One row per start of a rate-limited job: its ``bucket`` and ``until`` (the start's
    time plus the limit's period). A bucket has room while fewer than its limit of its
    rows have an ``until`` still ahead; the claim that starts its jobs writes their rows
    in its own transaction, under the keyed claim's lock, so two workers never both
    take its last slot. Maintenance deletes rows past their ``until``. Revision
    ``flask_defer_0013``.
    """
    name = starts_table_name(jobs_table_name)
    if name in metadata.tables:
        return metadata.tables[name]
    id_type = BigInteger().with_variant(Integer(), "sqlite")
    table = Table(
        name,
        metadata,
        Column("id", id_type, primary_key=True, autoincrement=True),
        Column("bucket", String(255), nullable=False),
        Column("until", DateTime(timezone=True), nullable=False),
    )
    Index(f"ix_{name}_bucket_until", table.c.bucket, table.c.until)
    return table


def workers_table_name(jobs_table_name: str) -> str:
    """The name of the live workers table that belongs to *jobs_table_name*."""
    return f"{jobs_table_name}_workers"


def define_workers_table(metadata: MetaData, jobs_table_name: str = DEFAULT_TABLE_NAME) -> Table:
    """Add the live workers table to *metadata* (or return it if it is there).

    One row per running worker, and per ``run_due`` while it holds jobs: written when
    it starts, refreshed by its lease heartbeat (``last_seen``, the ids it is
    ``running``), deleted when it stops; a worker killed outright leaves its row, which
    readers call stale after two missed heartbeats and maintenance deletes after a day.
    ``listening`` is whether its LISTEN hears (PostgreSQL), None where there is none.
    Revision ``flask_defer_0014``.
    """
    name = workers_table_name(jobs_table_name)
    if name in metadata.tables:
        return metadata.tables[name]
    return Table(
        name,
        metadata,
        Column("id", String(100), primary_key=True),
        Column("kind", String(16), nullable=False),
        Column("host", String(255), nullable=False),
        Column("pid", Integer, nullable=False),
        Column("queues", JSON, nullable=False),
        Column("concurrency", Integer, nullable=False),
        Column("version", String(32), nullable=False),
        Column("started_at", DateTime(timezone=True), nullable=False),
        Column("last_seen", DateTime(timezone=True), nullable=False),
        Column("heartbeat_seconds", Float, nullable=False),
        Column("running", JSON, nullable=False),
        Column("listening", Boolean, nullable=True),
        # The job names it has handlers for: explain's "no live worker knows its name".
        Column("names", JSON, nullable=False),
    )


def activity_table_name(jobs_table_name: str) -> str:
    """The name of the activity aggregate table that belongs to *jobs_table_name*."""
    return f"{jobs_table_name}_activity"


def define_activity_table(
    metadata: MetaData, jobs_table_name: str = DEFAULT_TABLE_NAME
) -> Table:
    """Add the activity aggregate table to *metadata* (or return it if it is there).

    One row per span (``m``: a minute, ``h``: an hour), its start, queue and job name:
    runs started, done, failed and retried, and a histogram of their lateness
    (``late_0`` ... ``late_9``, bounds in ``store.activity.LATENESS_BOUNDS``). Workers
    add to it with an upsert every few seconds; the primary key is the only index the
    reads need. Revision ``flask_defer_0016``.
    """
    name = activity_table_name(jobs_table_name)
    if name in metadata.tables:
        return metadata.tables[name]
    counts = ["started", "done", "failed", "retried", *[f"late_{i}" for i in range(10)]]
    return Table(
        name,
        metadata,
        Column("span", String(1), primary_key=True),
        Column("start", DateTime(timezone=True), primary_key=True),
        Column("queue", String(100), primary_key=True),
        Column("name", String(200), primary_key=True),
        *[Column(c, Integer, nullable=False, server_default="0") for c in counts],
    )
