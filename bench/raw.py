"""Raw-SQL loops over flask_defer's own table: the limit a job library can approach.

They use the very table and indexes flask_defer creates, the same claim guard
(``status = 'pending' AND waiting_for IS NULL AND run_at <= now``: the last term is
what lets the partial index of ready rows serve it; ``FOR UPDATE SKIP LOCKED`` on PostgreSQL,
``UPDATE ... RETURNING`` in ``BEGIN IMMEDIATE`` on SQLite) and the same compare-and-set
acknowledgement, but no Python layers in between. Every job is acknowledged in its
own transaction, as a worker that does not want to redo finished jobs after a crash
must do; the "batch ack" variant, which marks a whole claimed batch done in one
statement, is shown as the ceiling, not as a like-for-like baseline.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy import MetaData, create_engine, event

from flask_defer.store import JobStore
from flask_defer.store.schema import define_jobs_table

from .app import NOOP, sqlite_time
from .env import Database

LEASE = timedelta(seconds=30)

_COLUMNS = (
    "name, queue, payload, status, run_at, due_at, attempts, max_attempts, created_at, updated_at"
)


def create_jobs_table(db: Database) -> None:
    """Create flask_defer's table and indexes in *db* (what ``flask defer install`` does)."""
    engine = create_engine(db.url)
    if db.backend == "sqlite":

        @event.listens_for(engine, "connect")
        def _wal(dbapi_connection: object, _record: object) -> None:
            dbapi_connection.execute("PRAGMA journal_mode = WAL")  # type: ignore[attr-defined]

    try:
        JobStore(engine, define_jobs_table(MetaData())).create_table()
    finally:
        engine.dispose()


def sqlite_connect(db: Database) -> sqlite3.Connection:
    """A sqlite3 connection as flask_defer tunes its own: WAL, busy timeout, autocommit."""
    assert db.path is not None
    conn = sqlite3.connect(db.path, isolation_level=None, timeout=10)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA busy_timeout = 10000")
    return conn


# -- filling the table fast (setup, never timed) -------------------------------------


def fill(db: Database, count: int, *, run_at: datetime, name: str = NOOP) -> None:
    """Insert *count* pending no-op jobs due at *run_at* (plus one microsecond per row).

    One set-based statement: ``generate_series`` on PostgreSQL, a recursive CTE on
    SQLite. Then ``ANALYZE``, which autovacuum would do on a live system, so every
    contender's planner sees the table as it is.
    """
    if count <= 0:
        return
    if db.backend == "postgresql":
        assert db.dsn is not None
        with psycopg.connect(db.dsn) as conn:
            conn.execute(
                f"INSERT INTO defer_jobs ({_COLUMNS}) "
                "SELECT %(name)s, 'default', jsonb_build_object('n', g), 'pending',"
                " %(run_at)s + g * interval '1 microsecond',"
                " %(run_at)s + g * interval '1 microsecond', 0, 3, now(), now()"
                " FROM generate_series(1, %(count)s) AS g",
                {"name": name, "run_at": run_at, "count": count},
            )
            conn.commit()
            conn.execute("ANALYZE defer_jobs")
        return
    conn = sqlite_connect(db)
    try:
        # Whole seconds from the base, then one microsecond per row, as on PostgreSQL.
        base = sqlite_time(run_at.replace(microsecond=0))[:19]
        stamp = sqlite_time(datetime.now(UTC))
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?),"
            " t(n, at) AS (SELECT n, strftime('%Y-%m-%d %H:%M:%S', ?, '+' || (n / 1000000)"
            " || ' seconds') || printf('.%06d', n % 1000000) FROM g) "
            f"INSERT INTO defer_jobs ({_COLUMNS}) "
            "SELECT ?, 'default', json_object('n', n), 'pending', at, at, 0, 3, ?, ? FROM t",
            (count, base, name, stamp, stamp),
        )
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
    finally:
        conn.close()


def clear(db: Database) -> None:
    """Empty the table (and the job history, once the app created it) between rounds."""
    if db.backend == "postgresql":
        assert db.dsn is not None
        with psycopg.connect(db.dsn) as conn:
            conn.execute("TRUNCATE defer_jobs RESTART IDENTITY")
            conn.execute(
                "DO $$ BEGIN IF to_regclass('defer_jobs_history') IS NOT NULL THEN"
                " TRUNCATE defer_jobs_history RESTART IDENTITY; END IF; END $$"
            )
        return
    conn = sqlite_connect(db)
    try:
        conn.execute("DELETE FROM defer_jobs")
        history = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'defer_jobs_history'"
        ).fetchone()
        if history:
            conn.execute("DELETE FROM defer_jobs_history")
        conn.execute("VACUUM")
    finally:
        conn.close()


def live_workers(db: Database, since: datetime, before: datetime) -> int:
    """How many ``flask defer worker`` processes started in [*since*, *before*) have
    their row in the workers table (a worker writes it on start and deletes it on a
    graceful stop; one killed earlier leaves a row that *since* leaves out)."""
    sql = (
        "SELECT count(*) FROM defer_jobs_workers"
        " WHERE kind = 'worker' AND started_at >= {p} AND started_at < {p}"
    )
    if db.backend == "postgresql":
        assert db.dsn is not None
        with psycopg.connect(db.dsn) as conn:
            row = conn.execute(sql.format(p="%s"), (since, before)).fetchone()
    else:
        conn = sqlite_connect(db)
        try:
            row = conn.execute(
                sql.format(p="?"), (sqlite_time(since), sqlite_time(before))
            ).fetchone()
        finally:
            conn.close()
    assert row is not None
    return int(row[0])


def count_by_status(db: Database) -> dict[str, int]:
    if db.backend == "postgresql":
        assert db.dsn is not None
        with psycopg.connect(db.dsn) as conn:
            rows = conn.execute(
                "SELECT status, count(*) FROM defer_jobs GROUP BY status"
            ).fetchall()
    else:
        conn = sqlite_connect(db)
        try:
            rows = conn.execute(
                "SELECT status, count(*) FROM defer_jobs GROUP BY status"
            ).fetchall()
        finally:
            conn.close()
    return {str(status): int(n) for status, n in rows}


# -- drain loops -------------------------------------------------------------------

_PG_CLAIM = """
WITH due AS MATERIALIZED (
    SELECT id FROM defer_jobs
    WHERE status = 'pending' AND waiting_for IS NULL AND run_at <= %(now)s
    ORDER BY run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE defer_jobs AS t
SET status = 'running', attempts = t.attempts + 1, claim_token = %(token)s,
    lease_expires_at = %(lease)s, updated_at = %(now)s
FROM due WHERE t.id = due.id
RETURNING t.id, t.name, t.payload, t.claim_token
"""

_PG_DONE = """
UPDATE defer_jobs
SET status = 'done', finished_at = %(now)s, updated_at = %(now)s,
    claim_token = NULL, lease_expires_at = NULL, last_error = NULL, result = NULL
WHERE id = %(id)s AND status = 'running' AND claim_token = %(token)s
"""

_PG_DONE_BATCH = """
UPDATE defer_jobs
SET status = 'done', finished_at = %(now)s, updated_at = %(now)s,
    claim_token = NULL, lease_expires_at = NULL, last_error = NULL, result = NULL
WHERE id = ANY(%(ids)s) AND status = 'running' AND claim_token = %(token)s
"""


def pg_drain(db: Database, *, batch: int, batch_ack: bool = False) -> int:
    """Claim *batch* due jobs at a time on one connection, run a no-op, mark each done."""
    assert db.dsn is not None
    done = 0
    with psycopg.connect(db.dsn) as conn:
        while True:
            now = datetime.now(UTC)
            token = uuid.uuid4().hex
            rows = conn.execute(
                _PG_CLAIM, {"now": now, "limit": batch, "token": token, "lease": now + LEASE}
            ).fetchall()
            conn.commit()
            if not rows:
                return done
            if batch_ack:
                conn.execute(
                    _PG_DONE_BATCH,
                    {"ids": [row[0] for row in rows], "token": token, "now": datetime.now(UTC)},
                )
                conn.commit()
                done += len(rows)
                continue
            for row in rows:
                _noop(row[2])
                conn.execute(_PG_DONE, {"id": row[0], "token": token, "now": datetime.now(UTC)})
                conn.commit()
                done += 1


_SQLITE_CLAIM = """
UPDATE defer_jobs
SET status = 'running', attempts = attempts + 1, claim_token = ?,
    lease_expires_at = ?, updated_at = ?
WHERE id IN (
    SELECT id FROM defer_jobs
    WHERE status = 'pending' AND waiting_for IS NULL AND run_at <= ?
    ORDER BY run_at, id LIMIT ?
) AND status = 'pending'
RETURNING id, name, payload
"""

_SQLITE_DONE = """
UPDATE defer_jobs
SET status = 'done', finished_at = ?, updated_at = ?,
    claim_token = NULL, lease_expires_at = NULL, last_error = NULL, result = NULL
WHERE id = ? AND status = 'running' AND claim_token = ?
"""


def sqlite_drain(db: Database, *, batch: int = 1, batch_ack: bool = False) -> int:
    """Claim with ``UPDATE ... RETURNING`` in ``BEGIN IMMEDIATE``; mark each job done
    (``batch_ack``: the whole claimed batch in one transaction, the ceiling)."""
    conn = sqlite_connect(db)
    done = 0
    try:
        while True:
            now = datetime.now(UTC)
            token = uuid.uuid4().hex
            conn.execute("BEGIN IMMEDIATE")
            rows = conn.execute(
                _SQLITE_CLAIM,
                (token, sqlite_time(now + LEASE), sqlite_time(now), sqlite_time(now), batch),
            ).fetchall()
            conn.execute("COMMIT")
            if not rows:
                return done
            if batch_ack:
                for row in rows:
                    _noop(json.loads(row[2]))
                stamp = sqlite_time(datetime.now(UTC))
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(_SQLITE_DONE, [(stamp, stamp, row[0], token) for row in rows])
                conn.execute("COMMIT")
                done += len(rows)
                continue
            for row in rows:
                _noop(json.loads(row[2]))
                stamp = sqlite_time(datetime.now(UTC))
                conn.execute(_SQLITE_DONE, (stamp, stamp, row[0], token))
                done += 1
    finally:
        conn.close()


def _noop(payload: object) -> None:
    """The job's work: nothing (the payload is decoded, as a handler would see it)."""


# -- inserts -------------------------------------------------------------------------

_PG_INSERT = (
    f"INSERT INTO defer_jobs ({_COLUMNS}) "
    "VALUES (%s, 'default', %s, 'pending', %s, %s, 0, 3, %s, %s)"
)
_SQLITE_INSERT = (
    f"INSERT INTO defer_jobs ({_COLUMNS}) VALUES (?, 'default', ?, 'pending', ?, ?, 0, 3, ?, ?)"
)


def pg_insert(db: Database, count: int, *, run_at: datetime, bulk: bool) -> int:
    """Insert *count* jobs: one ``executemany`` in one transaction, or one commit each."""
    assert db.dsn is not None
    now = datetime.now(UTC)
    with psycopg.connect(db.dsn) as conn:
        if bulk:
            with conn.cursor() as cur:
                cur.executemany(
                    _PG_INSERT,
                    [(NOOP, Jsonb({"n": n}), run_at, run_at, now, now) for n in range(count)],
                )
            conn.commit()
            return count
        for n in range(count):
            conn.execute(_PG_INSERT, (NOOP, Jsonb({"n": n}), run_at, run_at, now, now))
            conn.commit()
    return count


def sqlite_insert(db: Database, count: int, *, run_at: datetime, bulk: bool) -> int:
    """The SQLite counterpart of :func:`pg_insert`."""
    conn = sqlite_connect(db)
    at = sqlite_time(run_at)
    now = sqlite_time(datetime.now(UTC))
    try:
        if bulk:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                _SQLITE_INSERT,
                [(NOOP, json.dumps({"n": n}), at, at, now, now) for n in range(count)],
            )
            conn.execute("COMMIT")
            return count
        # BEGIN; INSERT; COMMIT, as the PostgreSQL loop's transactions (psycopg sends the
        # BEGIN) and as the target states it; a deferred BEGIN, the cheapest there is.
        for n in range(count):
            conn.execute("BEGIN")
            conn.execute(_SQLITE_INSERT, (NOOP, json.dumps({"n": n}), at, at, now, now))
            conn.execute("COMMIT")
    finally:
        conn.close()
    return count


def finished_span(db: Database) -> tuple[float, float, int]:
    """First and last ``finished_at`` of done jobs (epoch seconds), and how many are done."""
    if db.backend == "postgresql":
        assert db.dsn is not None
        with psycopg.connect(db.dsn) as conn:
            row = conn.execute(
                "SELECT extract(epoch FROM min(finished_at)), extract(epoch FROM max(finished_at)),"
                " count(*) FROM defer_jobs WHERE status = 'done'"
            ).fetchone()
        assert row is not None
        return float(row[0] or 0), float(row[1] or 0), int(row[2])
    conn = sqlite_connect(db)
    try:
        row = conn.execute(
            "SELECT min(finished_at), max(finished_at), count(*) FROM defer_jobs"
            " WHERE status = 'done'"
        ).fetchone()
    finally:
        conn.close()
    if not row[2]:
        return 0.0, 0.0, 0

    def epoch(text: str) -> float:
        return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()

    return epoch(row[0]), epoch(row[1]), int(row[2])


def claim_plan(db: Database) -> str:
    """How the database finds due jobs (the claim's inner query), in one line."""
    now = datetime.now(UTC)
    if db.backend == "postgresql":
        assert db.dsn is not None
        with psycopg.connect(db.dsn) as conn:
            lines = [
                row[0]
                for row in conn.execute(
                    "EXPLAIN SELECT id FROM defer_jobs WHERE status = 'pending'"
                    " AND waiting_for IS NULL AND run_at <= %s ORDER BY run_at, id LIMIT 10"
                    " FOR UPDATE SKIP LOCKED",
                    (now,),
                )
            ]
        scans = [line.strip().lstrip("-> ").split("  (")[0] for line in lines if "Scan" in line]
        return "; ".join(scans)
    conn = sqlite_connect(db)
    try:
        rows = conn.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM defer_jobs WHERE status = 'pending'"
            " AND waiting_for IS NULL"
            " AND run_at <= ? ORDER BY run_at, id LIMIT 10",
            (sqlite_time(now),),
        ).fetchall()
    finally:
        conn.close()
    return "; ".join(str(row[-1]) for row in rows)


def fill_history(db: Database, settled: int, pending: int, *, names: int = 5) -> None:
    """A table the size the reads targets name: *settled* done/cancelled rows of history
    (1 in 20 cancelled) and *pending* live rows (9 in 10 due next week, the rest due
    now), spread over *names* job names. Set-based, as :func:`fill`; then ``ANALYZE``
    and, on PostgreSQL, ``VACUUM`` (the visibility map autovacuum would set on a table
    that has been sitting there).
    """
    week = timedelta(days=7)
    now = datetime.now(UTC)
    if db.backend == "postgresql":
        assert db.dsn is not None
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            conn.execute(
                f"INSERT INTO defer_jobs ({_COLUMNS}, finished_at) "
                "SELECT 'job_' || (g %% %(names)s), 'default', jsonb_build_object('n', g),"
                " CASE WHEN g %% 20 = 0 THEN 'cancelled' ELSE 'done' END,"
                " %(old)s, %(old)s, 1, 3, %(old)s, %(old)s,"
                " %(old)s + g * interval '1 millisecond'"
                " FROM generate_series(1, %(settled)s) AS g",
                {"names": names, "old": now - week, "settled": settled},
            )
            conn.execute(
                f"INSERT INTO defer_jobs ({_COLUMNS}) "
                "SELECT 'job_' || (g %% %(names)s), 'default', jsonb_build_object('n', g),"
                " 'pending', CASE WHEN g %% 10 = 0 THEN %(now)s ELSE %(later)s END,"
                " CASE WHEN g %% 10 = 0 THEN %(now)s ELSE %(later)s END, 0, 3, %(now)s, %(now)s"
                " FROM generate_series(1, %(pending)s) AS g",
                {"names": names, "now": now, "later": now + week, "pending": pending},
            )
            conn.execute("VACUUM ANALYZE defer_jobs")
        return
    conn = sqlite_connect(db)
    try:
        old, at, later = sqlite_time(now - week), sqlite_time(now), sqlite_time(now + week)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?) "
            f"INSERT INTO defer_jobs ({_COLUMNS}, finished_at) "
            "SELECT 'job_' || (n % ?), 'default', json_object('n', n),"
            " CASE WHEN n % 20 = 0 THEN 'cancelled' ELSE 'done' END, ?, ?, 1, 3, ?, ?,"
            " strftime('%Y-%m-%d %H:%M:%S', ?, '+' || (n / 1000) || ' seconds')"
            " || printf('.%06d', (n % 1000) * 1000) FROM g",
            (settled, names, old, old, old, old, old[:19]),
        )
        conn.execute(
            "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?) "
            f"INSERT INTO defer_jobs ({_COLUMNS}) "
            "SELECT 'job_' || (n % ?), 'default', json_object('n', n), 'pending',"
            " CASE WHEN n % 10 = 0 THEN ? ELSE ? END, CASE WHEN n % 10 = 0 THEN ? ELSE ? END,"
            " 0, 3, ?, ? FROM g",
            (pending, names, at, later, at, later, at, at),
        )
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
    finally:
        conn.close()
