"""The text of the claim and of "when is the next claimable job due", for both backends.

One claim takes the due jobs of one priority, the most urgent that has any, in
``run_at`` order. Finding that priority must not walk rows that are not due: a
priority's pending rows sit in the ``(priority, run_at, id)`` index in run-time order, so
its due rows are at the front of its range, and the claim only asks each priority
present for its first row (a "loose index scan", written as a recursive query that
stops at the first priority with a due row). A million jobs due next month at a more
urgent priority cost the claim one index step, not a million.

Jobs with a ``concurrency_key`` are claimed by a second statement (see
:func:`keyed_claim_sql`): how many of a key may start depends on how many of it run,
which the batch claim cannot know row by row. Both statements share the conditions
every claimable row meets (:func:`claimable`): due, not expired, in the worker's
queues, and neither its queue nor its name paused.

Plain SQL text rather than SQLAlchemy constructs because SQLite needs ``INDEXED BY``
(its planner, without statistics, would read every pending row through the status
index instead), and both backends need the recursive loose scan.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Seconds the claims run the keyed statement after keyed jobs were last seen (or this
#: process scheduled one), before they look again whether any are pending.
KEYED_MEMORY = 2.0

#: How a statement tests a row's queue against the worker's ``:queues``. An expanding
#: ``IN`` is SQLAlchemy's (one bind per queue, so only its compiler can run it); the
#: other two bind the queues as one value, one PostgreSQL array or one JSON array read by
#: SQLite's ``json_each``, so the statement's text is the same for any number of queues
#: and a driver can run it without SQLAlchemy's compiler.
QUEUES_EXPANDING = "IN :queues"
QUEUES_ARRAY = "= ANY(:queues)"
QUEUES_JSON = "IN (SELECT value FROM json_each(:queues))"

#: Pending rows without a key and not waiting for parents: the rows of
#: ``ix_<table>_pending_priority``.
UNKEYED = "status = 'pending' AND waiting_for IS NULL AND concurrency_key IS NULL"
#: Pending rows with a key, not waiting: the rows of ``ix_<table>_keyed_pending``.
KEYED = "status = 'pending' AND waiting_for IS NULL AND concurrency_key IS NOT NULL"
#: Running rows with a key; the first two terms are ``ix_<table>_keyed_live``'s own
#: predicate, written out so SQLite (which only matches terms) may use that index.
KEYED_RUNNING = (
    "status IN ('pending', 'running') AND concurrency_key IS NOT NULL AND status = 'running'"
)


@dataclass(frozen=True)
class ClaimTables:
    """What the statements name: the quoted tables and SQLite's index hints."""

    jobs: str
    #: ``INDEXED BY ...`` (or "") for the unkeyed and the keyed pending index.
    unkeyed_hint: str = ""
    keyed_hint: str = ""
    #: The quoted pauses table, or None when this store has none.
    pauses: str | None = None
    #: The quoted rate-limit starts table (``store.schema.define_starts_table``).
    starts: str | None = None


def claimable(
    tables: ClaimTables, *, queues: bool, alias: str = "", member: str = QUEUES_EXPANDING
) -> str:
    """``AND ...`` terms every claimable pending row meets besides being due.

    Not expired (``expires_at`` after ``:now``); in the worker's ``:queues`` when it has
    some, tested by *member* (one of the ``QUEUES_*`` forms above); neither queue nor
    name paused. *alias* qualifies the columns (``"j."``).
    """
    terms = [f" AND ({alias}expires_at IS NULL OR {alias}expires_at > :now)"]
    if queues:
        terms.append(f" AND {alias}queue {member}")
    if tables.pauses is not None:
        terms.append(
            f" AND {alias}queue NOT IN (SELECT value FROM {tables.pauses} WHERE kind = 'queue')"
            f" AND {alias}name NOT IN (SELECT value FROM {tables.pauses} WHERE kind = 'name')"
        )
    return "".join(terms)


def _levels(tables: ClaimTables) -> str:
    """A recursive CTE ``levels(p)``: each priority that has an unkeyed pending row."""
    t, hint = tables.jobs, tables.unkeyed_hint
    first = f"SELECT priority FROM {t}{hint} WHERE {UNKEYED}"
    return (
        f"levels(p) AS (SELECT ({first} ORDER BY priority LIMIT 1)"
        f" UNION ALL SELECT ({first} AND priority > levels.p ORDER BY priority LIMIT 1)"
        " FROM levels WHERE levels.p IS NOT NULL)"
    )


def limit_sql(limit: int | None) -> str:
    """``LIMIT :limit``, or with *limit* the number itself.

    PostgreSQL plans a prepared statement once (a generic plan) only when the plan it
    would make for the given values is no cheaper; an unknown ``LIMIT`` looks like a
    tenth of the table to it, so it planned every claim anew (0.4-0.6 ms, about half
    the claim's time). A statement per limit, at most ``DEFER_CLAIM_BATCH`` of them,
    lets it keep one plan.
    """
    return "LIMIT :limit" if limit is None else f"LIMIT {int(limit)}"


def due_ids_sql(
    tables: ClaimTables,
    *,
    queues: bool,
    lock: bool,
    limit: int | None = None,
    member: str = QUEUES_EXPANDING,
) -> tuple[str, str]:
    """``(ctes, select)``: the unkeyed ids to claim, most urgent due priority first.

    ``ctes`` go after ``WITH RECURSIVE``; ``select`` picks up to ``:limit`` (or *limit*)
    ids of the chosen priority in ``(run_at, id)`` order, ``FOR UPDATE SKIP LOCKED``
    with *lock*; *member* tests the queues (see :func:`claimable`).
    """
    t, hint = tables.jobs, tables.unkeyed_hint
    where = f"{UNKEYED} AND run_at <= :now{claimable(tables, queues=queues, member=member)}"
    # A scalar subquery with LIMIT 1, not EXISTS: PostgreSQL turns an EXISTS into a
    # semi-join that reads every due row (measured: 5,960 rows hashed per claim). Its
    # ORDER BY walks the priority index from the level's earliest row; without it
    # PostgreSQL read the table from its start, past every settled row.
    level = (
        f"level AS (SELECT p FROM levels WHERE p IS NOT NULL AND (SELECT 1 FROM"
        f" {t}{hint} WHERE {where} AND priority = levels.p ORDER BY priority, run_at"
        " LIMIT 1) IS NOT NULL LIMIT 1)"
    )
    select = (
        f"SELECT id FROM {t}{hint} WHERE {where} AND priority = (SELECT p FROM level)"
        f" ORDER BY run_at, id {limit_sql(limit)}"
    )
    if lock:
        select += " FOR UPDATE SKIP LOCKED"
    return f"{_levels(tables)}, {level}", select


def keyed_ids_sql(
    tables: ClaimTables, *, queues: bool, limit: int | None = None, member: str = QUEUES_EXPANDING
) -> tuple[str, str]:
    """``(ctes, select)``: due keyed jobs that fit under their key's limit, up to
    ``:limit`` (or *limit*), none less urgent than the most urgent due unkeyed job.

    Each key's due jobs are numbered in claim order; a job fits when its number plus the
    key's running jobs is within its ``concurrency_limit``. Reads every due keyed row,
    so its cost grows with the keyed backlog (see the module's docstring); the caller
    serialises it per table, so two claims never both fill a key's last slot. Keyed
    jobs of a lower priority than a due unkeyed one wait for it (the claim goes on
    with the unkeyed level), so priority orders every due job, keyed or not; the
    unkeyed level is found with the same loose scan as :func:`due_ids_sql`'s.
    ``ctes`` go after ``WITH RECURSIVE``.
    """
    t, hint = tables.jobs, tables.keyed_hint
    unkeyed_where = f"{UNKEYED} AND run_at <= :now{claimable(tables, queues=queues, member=member)}"
    level = (
        f"level AS (SELECT p FROM levels WHERE p IS NOT NULL AND (SELECT 1 FROM"
        f" {t}{tables.unkeyed_hint} WHERE {unkeyed_where} AND priority = levels.p"
        " ORDER BY priority, run_at LIMIT 1) IS NOT NULL LIMIT 1)"
    )
    select = (
        "SELECT c.id FROM (SELECT id, concurrency_key, concurrency_limit, rate_limit,"
        " priority, run_at,"
        " row_number() OVER (PARTITION BY concurrency_key ORDER BY priority, run_at, id)"
        f" AS n FROM {t}{hint} WHERE {KEYED} AND run_at <= :now"
        f"{claimable(tables, queues=queues, member=member)}) AS c"
        f" LEFT JOIN (SELECT concurrency_key, count(*) AS n FROM {t} WHERE {KEYED_RUNNING}"
        " GROUP BY concurrency_key) AS busy ON busy.concurrency_key = c.concurrency_key"
        f"{_recent_join(tables)}"
        f" WHERE {_FITS}"
        " AND c.priority <= coalesce((SELECT p FROM level), c.priority)"
        f" ORDER BY c.priority, c.run_at, c.id {limit_sql(limit)}"
    )
    return f"{_levels(tables)}, {level}", select


#: A keyed job fits when its number in its key's queue, plus what its key already holds,
#: is within its limit: jobs running for a concurrency limit, starts within the period
#: for a rate limit (``rate_limit`` set: any number of its jobs may run at once).
_FITS = (
    "((c.rate_limit IS NULL"
    " AND c.n + coalesce(busy.n, 0) <= coalesce(c.concurrency_limit, 1))"
    " OR (c.rate_limit IS NOT NULL AND c.n + coalesce(recent.n, 0) <= c.rate_limit))"
)


def _recent_join(tables: ClaimTables) -> str:
    """``LEFT JOIN`` of each rate bucket's starts that still count at ``:now``."""
    if tables.starts is None:
        return " LEFT JOIN (SELECT NULL AS bucket, 0 AS n) AS recent ON 1 = 0"
    return (
        f" LEFT JOIN (SELECT bucket, count(*) AS n FROM {tables.starts} WHERE until > :now"
        " GROUP BY bucket) AS recent ON recent.bucket = c.concurrency_key"
    )


def next_unkeyed_sql(tables: ClaimTables, *, queues: bool) -> str:
    """The earliest ``run_at`` of a claimable unkeyed job: one step per priority present.

    Expired rows count until the sweep settles them (at most a maintenance round), so
    ``:now`` is the caller's clock.
    """
    t, hint = tables.jobs, tables.unkeyed_hint
    first = (
        f"SELECT run_at FROM {t}{hint} WHERE {UNKEYED} AND priority = levels.p"
        f"{claimable(tables, queues=queues)} ORDER BY run_at LIMIT 1"
    )
    return (
        f"WITH RECURSIVE {_levels(tables)}"
        f" SELECT min(({first})) FROM levels WHERE levels.p IS NOT NULL"
    )


def next_keyed_sql(tables: ClaimTables, *, queues: bool) -> str:
    """The earliest moment a keyed job may start: its ``run_at`` once its key has a
    free slot. A concurrency key at its limit waits for a running job to end (which
    wakes the workers); a full rate bucket frees a slot when its oldest counted start
    stops counting, so that moment (or the job's ``run_at``, if later) is the answer,
    and a worker sleeps until then rather than polling the bucket."""
    t, hint = tables.jobs, tables.keyed_hint
    running = (
        f"SELECT count(*) FROM {t} AS r WHERE r.{KEYED_RUNNING.replace(' AND ', ' AND r.')}"
        " AND r.concurrency_key = j.concurrency_key"
    )
    when = "j.run_at"
    if tables.starts is not None:
        counted = f"FROM {tables.starts} AS s WHERE s.bucket = j.concurrency_key AND s.until > :now"
        freed = f"(SELECT min(s.until) {counted})"
        when = (
            "CASE WHEN j.rate_limit IS NULL THEN j.run_at"
            f" WHEN (SELECT count(*) {counted}) < j.rate_limit THEN j.run_at"
            f" WHEN {freed} > j.run_at THEN {freed} ELSE j.run_at END"
        )
    return (
        f"SELECT min({when}) FROM {t} AS j{hint} WHERE j.{KEYED.replace(' AND ', ' AND j.')}"
        f"{claimable(tables, queues=queues, alias='j.')}"
        f" AND (j.rate_limit IS NOT NULL OR ({running}) < coalesce(j.concurrency_limit, 1))"
    )
