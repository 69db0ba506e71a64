"""How late do jobs start? Lateness of the real worker on SQLite and PostgreSQL.

Schedules N jobs (default 100) due at now + uniform(1, 3) s, each in its own
transaction as a web app would, while a worker runs in a separate process
(``Defer.worker().run()`` as ``flask defer worker`` runs it). Each handler
returns the wall-clock time it started; lateness = start - run_at. Prints p50, p99
and max per backend.

    python -m bench.lateness                       # both backends
    python -m bench.lateness --backend sqlite --jobs 500
    python -m bench.lateness --postgres-url postgresql+psycopg://user@host/db

Without ``--postgres-url`` a throwaway PostgreSQL server is started (the test
suite's ``tests/pg_cluster.py``). Uses the default settings (``DEFER_POLL_INTERVAL``
0.5 s on SQLite) unless ``--poll`` says otherwise; ``--delay 0 0`` schedules jobs due
at once instead, which measures the wake-up path (NOTIFY vs. poll).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import create_engine, text
from sqlalchemy.orm import DeclarativeBase

from flask_defer import Defer, Job, JobStatus
from flask_defer.engine.collector import startup_objects_spared_from_gc


class Model(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Model)
defer = Defer(db=db)


@defer.job("stamp")
def stamp(job: Job) -> float:
    """Record when the handler started, as seconds since the epoch."""
    return time.time()


def create_app(database_url: str, poll: float | None = None) -> Flask:
    app = Flask("bench_lateness")
    app.config["SQLALCHEMY_DATABASE_URI"] = database_url
    if poll is not None:
        app.config["DEFER_POLL_INTERVAL"] = poll
    db.init_app(app)
    defer.init_app(app)
    with app.app_context():
        db.create_all()
    return app


def serve(database_url: str, poll: float | None) -> None:
    """The worker process: run until SIGTERM, as ``flask defer worker`` runs one (its
    start-up objects kept out of full garbage collections)."""
    app = create_app(database_url, poll)
    with app.app_context():
        worker = defer.worker()
    print("worker ready", flush=True)
    with startup_objects_spared_from_gc():
        worker.run()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(int(round(fraction * (len(ordered) - 1))), len(ordered) - 1)
    return ordered[index]


def measure(
    database_url: str, jobs: int, poll: float | None, delays: tuple[float, float]
) -> list[float]:
    app = create_app(database_url, poll)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    args = [sys.executable, "-m", "bench.lateness", "--serve", database_url]
    if poll is not None:
        args += ["--poll", str(poll)]
    worker = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None
        if worker.stdout.readline().strip() != "worker ready":
            raise RuntimeError("the worker process did not start")
        time.sleep(1.0)  # let it settle into its idle sleep
        ids = []
        began = time.monotonic()
        with app.app_context():
            for _ in range(jobs):
                delay = timedelta(seconds=random.uniform(*delays))
                ids.append(defer.schedule("stamp", delay=delay).id)
                db.session.commit()
        print(f"  scheduled {jobs} jobs in {time.monotonic() - began:.2f} s", file=sys.stderr)
        deadline = time.monotonic() + 60
        while True:
            with app.app_context():
                done = [j for j in defer.list(status=JobStatus.DONE, limit=10_000)]
            if len(done) >= jobs or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        if len(done) < jobs:
            raise RuntimeError(f"only {len(done)} of {jobs} jobs ran within 60 s")
        return [float(j.result) - j.run_at.timestamp() for j in done]
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
        with app.app_context():
            db.session.remove()
            db.engine.dispose()


def report(name: str, lateness: list[float]) -> None:
    ms = [value * 1000 for value in lateness]
    print(
        f"{name:<11} n={len(ms):<4} p50={statistics.median(ms):7.1f} ms  "
        f"p99={percentile(ms, 0.99):7.1f} ms  max={max(ms):7.1f} ms  "
        f"min={min(ms):6.1f} ms"
    )


def postgres_database(server_url: str | None) -> tuple[str, Any]:
    """A fresh database URL and a cleanup callable."""
    cluster = None
    if server_url is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.pg_cluster import PostgresCluster

        cluster = PostgresCluster()
        cluster.start()
        server_url = cluster.url
    name = f"bench_lateness_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def cleanup() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
        if cluster is not None:
            cluster.stop()

    return server_url.rsplit("/", 1)[0] + "/" + name, cleanup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--postgres-url", default=os.environ.get("DEFER_BENCH_POSTGRES_URL"))
    parser.add_argument("--poll", type=float, default=None, help="DEFER_POLL_INTERVAL, s")
    parser.add_argument(
        "--delay",
        type=float,
        nargs=2,
        default=(1.0, 3.0),
        metavar=("MIN", "MAX"),
        help="jobs are due after uniform(MIN, MAX) s; 0 0 measures the wake-up path "
        "for jobs due at once (NOTIFY on PostgreSQL, the poll on SQLite)",
    )
    parser.add_argument("--serve", metavar="DATABASE_URL", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.serve:
        serve(options.serve, options.poll)
        return
    low, high = options.delay
    print(
        f"lateness of {options.jobs} jobs due at now+uniform({low:g},{high:g})s, started by "
        f"a worker "
        f"process ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs)"
    )
    if options.backend in ("sqlite", "both"):
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{tmp}/bench.sqlite3"
            report("sqlite", measure(url, options.jobs, options.poll, (low, high)))
    if options.backend in ("postgresql", "both"):
        url, cleanup = postgres_database(options.postgres_url)
        try:
            report("postgresql", measure(url, options.jobs, options.poll, (low, high)))
        finally:
            cleanup()


if __name__ == "__main__":
    main()
