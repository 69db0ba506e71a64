"""What each index of ``defer_jobs`` costs one committed insert (``python -m bench.index_costs``).

A keyless job without an owner enters the table and the indexes whose predicate its
row meets. Each round inserts jobs one by one (``BEGIN; INSERT; COMMIT``, fsync on)
into fresh copies of the table, one copy with every index and one without each
index in turn, interleaved, over a table already holding pending rows (so the trees
have depth). The difference to "every index" is what that index costs the insert;
the figures decide which indexes a pending row should enter at all (issue 41).

python -m bench.index_costs                  # both backends
python -m bench.index_costs --backend sqlite --rounds 7 --jobs 1000
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg.types.json import Jsonb

from . import raw
from .app import NOOP, sqlite_time
from .env import BenchEnv, Database

_SQL = {
    "sqlite": raw._SQLITE_INSERT,
    "postgresql": raw._PG_INSERT,
}


def index_names(db: Database) -> list[str]:
    """The secondary indexes of ``defer_jobs`` in *db*."""
    if db.backend == "sqlite":
        conn = raw.sqlite_connect(db)
        try:
            rows = conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index'"
                " AND tbl_name = 'defer_jobs' AND sql IS NOT NULL ORDER BY name"
            ).fetchall()
        finally:
            conn.close()
        return [r[0] for r in rows]
    assert db.dsn is not None
    with psycopg.connect(db.dsn) as conn:
        rows = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'defer_jobs'"
            " AND indexname <> 'defer_jobs_pkey' ORDER BY indexname"
        ).fetchall()
    return [r[0] for r in rows]


def drop(db: Database, index: str) -> None:
    if db.backend == "sqlite":
        conn = raw.sqlite_connect(db)
        try:
            conn.execute(f'DROP INDEX "{index}"')
        finally:
            conn.close()
        return
    assert db.dsn is not None
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute(f'DROP INDEX "{index}"')


def insert_each(db: Database, count: int) -> float:
    """Microseconds per ``BEGIN; INSERT; COMMIT`` of a pending job due in an hour."""
    now = datetime.now(UTC)
    run_at = now + timedelta(hours=1)
    if db.backend == "sqlite":
        conn = raw.sqlite_connect(db)
        at, stamp = sqlite_time(run_at), sqlite_time(now)
        try:
            began = time.perf_counter()
            for n in range(count):
                conn.execute("BEGIN")
                conn.execute(_SQL["sqlite"], (NOOP, json.dumps({"n": n}), at, at, stamp, stamp))
                conn.execute("COMMIT")
            return (time.perf_counter() - began) / count * 1e6
        finally:
            conn.close()
    assert db.dsn is not None
    with psycopg.connect(db.dsn) as conn:
        began = time.perf_counter()
        for n in range(count):
            conn.execute(_SQL["postgresql"], (NOOP, Jsonb({"n": n}), run_at, run_at, now, now))
            conn.commit()
        return (time.perf_counter() - began) / count * 1e6


def measure(env: BenchEnv, backend: str, *, rounds: int, jobs: int, rows: int) -> None:
    full = env.database(backend, "index costs all")
    raw.create_jobs_table(full)
    names = index_names(full)
    variants: dict[str, Database] = {"every index": full}
    for name in [*names, "(none)"]:
        db = env.database(backend, f"index costs {name}")
        raw.create_jobs_table(db)
        for dropped in names if name == "(none)" else [name]:
            drop(db, dropped)
        variants[f"without {name}" if name != "(none)" else "no secondary index"] = db
    for db in variants.values():
        raw.fill(db, rows, run_at=datetime.now(UTC) + timedelta(days=365))
    times: dict[str, list[float]] = {label: [] for label in variants}
    for _ in range(rounds):
        for label, db in variants.items():
            times[label].append(insert_each(db, jobs))
    base = statistics.median(times["every index"])
    print(f"\n{backend}: {jobs:,} one-by-one inserts per round, {rounds} rounds,"
          f" {rows:,} rows already in the table; median µs per insert")  # fmt: skip
    print("| variant | µs per insert | saved vs every index | rounds |")
    print("| --- | --- | --- | --- |")
    for label, values in times.items():
        median = statistics.median(values)
        saved = base - median
        print(f"| {label} | {median:,.0f} | {saved:+,.0f} µs ({saved / base:+.0%})"
              f" | {', '.join(f'{v:,.0f}' for v in values)} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.index_costs")
    parser.add_argument("--backend", action="append", choices=("postgresql", "sqlite"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--rows", type=int, default=20_000)
    args = parser.parse_args()
    with BenchEnv() as env:
        for backend in args.backend or ("sqlite", "postgresql"):
            measure(env, backend, rounds=args.rounds, jobs=args.jobs, rows=args.rows)


if __name__ == "__main__":
    main()
