"""The benchmark's environment: a throwaway PostgreSQL, SQLite files, versions.

PostgreSQL comes from the test suite's ``tests.pg_cluster`` (a private cluster in a
temp directory, so a benchmark never touches a developer's own databases). Every
contender gets its own fresh database or SQLite file, so no one measures on another's
leftovers.
"""

from __future__ import annotations

import itertools
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from types import TracebackType

import psycopg

from tests.pg_cluster import PostgresCluster

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Database:
    """One fresh database: its SQLAlchemy URL and, for PostgreSQL, its libpq DSN."""

    backend: str
    url: str
    dsn: str | None = None
    path: Path | None = None


@dataclass
class BenchEnv:
    """Owns the PostgreSQL cluster and the temp directory for one benchmark run."""

    #: fsync on: the PostgreSQL users run (``--fsync-off`` for the test suite's setting).
    durable: bool = True
    cluster: PostgresCluster = field(init=False)
    tmp: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="flask-defer-bench-")))
    _numbers: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.cluster = PostgresCluster(durable=self.durable)

    def __enter__(self) -> BenchEnv:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.cluster.running:
            self.cluster.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def database(self, backend: str, label: str) -> Database:
        """A fresh, empty database for one contender."""
        number = next(self._numbers)
        safe = "".join(ch if ch.isalnum() else "_" for ch in label.lower())[:40]
        if backend == "sqlite":
            path = self.tmp / f"{number:03d}_{safe}.sqlite3"
            return Database("sqlite", f"sqlite:///{path}", path=path)
        name = f"bench_{number:03d}_{safe}"
        # Started on first use, so a SQLite-only run needs no PostgreSQL at all.
        self.cluster.start()
        url = self.cluster.create_database(name)
        dsn = f"host=127.0.0.1 port={self.cluster.port} user=postgres dbname={name}"
        return Database("postgresql", url, dsn=dsn)

    def commit_cost(self) -> str:
        """The machine's cost of one fsync'd commit: it decides every enqueue ratio.

        The median of 200 one-row INSERT + COMMIT on a fresh SQLite file (WAL,
        synchronous=FULL) and, when this run uses it, on the PostgreSQL cluster.
        """
        path = self.tmp / "commit_cost.sqlite3"
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("CREATE TABLE t (n INTEGER)")
        times = []
        for n in range(200):
            began = time.perf_counter()
            conn.execute("BEGIN")
            conn.execute("INSERT INTO t VALUES (?)", (n,))
            conn.execute("COMMIT")
            times.append(time.perf_counter() - began)
        conn.close()
        text = f"SQLite {statistics.median(times) * 1e6:,.0f} µs"
        if self.cluster.running:
            dsn = f"host=127.0.0.1 port={self.cluster.port} user=postgres dbname=postgres"
            with psycopg.connect(dsn, autocommit=True) as pg:
                pg.execute("CREATE TEMP TABLE t (n integer)")
                times = []
                for n in range(200):
                    began = time.perf_counter()
                    with pg.transaction():
                        pg.execute("INSERT INTO t VALUES (%s)", (n,))
                    times.append(time.perf_counter() - began)
            text += f", PostgreSQL {statistics.median(times) * 1e6:,.0f} µs"
        return text + " (median of 200 one-row INSERT + COMMIT)"

    @staticmethod
    def python_speed() -> float:
        """Milliseconds of a fixed pure-Python loop (the best of three): this host's CPU
        speed at the moment. Shared hosts run the same code up to twice as slow in some
        hours, and the ratios against raw loops (which run in C) fall most then; the
        report gives it at the start and at the end of the run."""
        best = float("inf")
        for _ in range(3):
            began = time.perf_counter()
            for _n in range(2_000_000):
                pass
            best = min(best, time.perf_counter() - began)
        return best * 1000

    def settle(self, timeout: float = 120.0) -> str | None:
        """Let the PostgreSQL server finish what the last section left it before the
        next one starts; what it waited for, or None when the server is not in use.

        A section that fills a million rows leaves a checkpoint to write them out,
        spread over minutes (``checkpoint_completion_target``), and autovacuum to look
        at the tables: work that would land on whichever contender of the next section
        runs meanwhile. ``CHECKPOINT`` writes it at once, then the wait lets running
        autovacuum workers end (up to *timeout* seconds).
        """
        if not self.cluster.running:
            return None
        dsn = f"host=127.0.0.1 port={self.cluster.port} user=postgres dbname=postgres"
        began = time.monotonic()
        with psycopg.connect(dsn, autocommit=True) as pg:
            pg.execute("CHECKPOINT")
            checkpointed = time.monotonic() - began
            while time.monotonic() - began < timeout:
                row = pg.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE backend_type = 'autovacuum worker'"
                ).fetchone()
                if row is None or not row[0]:
                    break
                time.sleep(0.5)
        return (
            f"checkpoint {checkpointed:.1f} s, autovacuum"
            f" {time.monotonic() - began - checkpointed:.1f} s"
        )

    def postgres_version(self) -> str:
        if not self.cluster.running:
            return "not used in this run"
        dsn = f"host=127.0.0.1 port={self.cluster.port} user=postgres dbname=postgres"
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            fsync = conn.execute("SHOW fsync").fetchone()
        assert row is not None and fsync is not None
        return f"{row[0]} (throwaway local cluster, fsync={fsync[0]})"


def versions() -> dict[str, str]:
    """Versions of everything that shapes the figures."""
    found = {
        "Python": f"{platform.python_version()} ({platform.python_implementation()})",
        "SQLite": f"{sqlite3.sqlite_version} (WAL, synchronous=FULL: flask_defer's defaults)",
    }
    for package in (
        "flask-defer-jobs",
        "SQLAlchemy",
        "psycopg",
        "Flask",
        "deferjob",
        "procrastinate",
        "pgqueuer",
        "asyncpg",
        "huey",
        "waitress",
    ):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


def git_revision() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out + ("+changes" if dirty else "")


def machine() -> dict[str, str]:
    return {
        "cores (os.cpu_count())": str(os.cpu_count()),
        "platform": platform.platform(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
