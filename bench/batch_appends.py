"""How long does ``defer.batch`` wait for SQLite's write lock beside a busy worker?

N appender threads add items to one batch key of one SQLite file, each item in its own
transaction as a web request would (``defer.batch`` then ``db.session.commit()``),
while a worker runs in a separate process: ``Defer.worker().run()`` (the code behind
``flask defer worker``) or, with ``--runner run-due``, a loop of ``defer.run_due()``
(a cron-style runner). Prints the append latency (batch + commit: p50, p99, max),
failed appends ("database is locked"), how late the batches started after they were
due, whether every item was delivered exactly once, and the runner's write
transactions (first write to connection check-in: how long it held the write lock).

    python -m bench.batch_appends                        # 4 appenders beside a worker
    python -m bench.batch_appends --runner run-due --appenders 8 --items 300
    python -m bench.batch_appends --window 0             # every batch due at once
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import event, text
from sqlalchemy.orm import DeclarativeBase

from flask_defer import Defer, Job


class Model(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Model)
defer = Defer(db=db)


@defer.job("digest")
def digest(job: Job) -> None:
    """A batch handler that does nothing: the store's own work is what is measured."""


def create_app(database_url: str, busy_timeout: float) -> Flask:
    app = Flask("bench_batch_appends")
    app.config["SQLALCHEMY_DATABASE_URI"] = database_url
    app.config["DEFER_SQLITE_BUSY_TIMEOUT"] = busy_timeout
    db.init_app(app)
    defer.init_app(app)
    with app.app_context():
        db.create_all()
    return app


def watch_write_transactions(engine: Any) -> list[float]:
    """Seconds each write transaction of *engine* held the lock (first write → check-in).

    Registered after flask_defer's own listener, so a first write is seen once the lock
    is taken.
    """
    held: list[float] = []
    first_write: dict[int, float] = {}

    @event.listens_for(engine, "before_cursor_execute")
    def wrote(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        verb = statement.lstrip().split(None, 1)[0].upper()
        if verb in ("INSERT", "UPDATE", "DELETE", "BEGIN", "WITH"):
            if verb == "BEGIN" and "IMMEDIATE" not in statement.upper():
                return
            first_write.setdefault(id(conn.connection.dbapi_connection), time.perf_counter())

    @event.listens_for(engine, "checkin")
    def returned(dbapi_connection: Any, _record: Any) -> None:
        began = first_write.pop(id(dbapi_connection), None)
        if began is not None:
            held.append(time.perf_counter() - began)

    return held


def serve(database_url: str, busy_timeout: float, runner: str) -> None:
    """The runner process: a worker, or a run_due loop, until SIGTERM; then its figures."""
    app = create_app(database_url, busy_timeout)
    with app.app_context():
        held = watch_write_transactions(db.engine)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        if runner == "worker":
            worker = defer.worker()
            signal.signal(signal.SIGTERM, lambda *_: (stop.set(), worker.stop()))
            print("runner ready", flush=True)
            worker.run()
        else:
            print("runner ready", flush=True)
            while not stop.is_set():
                if defer.run_due().ran == 0:
                    stop.wait(0.005)
    print(json.dumps({"held": held}), flush=True)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(round(fraction * (len(ordered) - 1))), len(ordered) - 1)]


def spread(values: list[float]) -> str:
    if not values:
        return "n=0"
    ms = [value * 1000 for value in values]
    return (
        f"n={len(ms)} mean={statistics.fmean(ms):.1f} ms p50={statistics.median(ms):.1f} ms "
        f"p99={percentile(ms, 0.99):.1f} ms max={max(ms):.1f} ms"
    )


def wait_for_drain(app: Flask, timeout: float) -> float:
    """Seconds until the runner has run every batch (none pending or running)."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        with app.app_context():
            left = db.session.execute(
                text(
                    "SELECT count(*) FROM defer_jobs WHERE name = 'digest'"
                    " AND status IN ('pending', 'running')"
                )
            ).scalar()
            db.session.remove()
        if not left:
            break
        time.sleep(0.1)
    return time.monotonic() - began


def measure(options: argparse.Namespace, database_url: str) -> None:
    app = create_app(database_url, options.busy_timeout)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    args = [sys.executable, "-m", "bench.batch_appends", "--serve", database_url]
    args += ["--runner", options.runner, "--busy-timeout", str(options.busy_timeout)]
    runner = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True)
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def append(producer: int) -> None:
        with app.app_context():
            for n in range(options.items):
                began = time.perf_counter()
                try:
                    defer.batch(
                        "digest",
                        key="post:1",
                        item=[producer, n],
                        window=options.window,
                        max_items=options.max_items,
                    )
                    db.session.commit()
                except Exception as error:  # noqa: BLE001 - counted and reported
                    db.session.rollback()
                    with lock:
                        errors.append(f"{type(error).__name__}: {error}".splitlines()[0])
                    continue
                with lock:
                    latencies.append(time.perf_counter() - began)
                if options.pause:
                    time.sleep(options.pause)

    try:
        assert runner.stdout is not None
        if runner.stdout.readline().strip() != "runner ready":
            raise RuntimeError("the runner process did not start")
        time.sleep(0.5)
        threads = [threading.Thread(target=append, args=(p,)) for p in range(options.appenders)]
        began = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - began
        drained = wait_for_drain(app, timeout=60.0)
    finally:
        runner.send_signal(signal.SIGTERM)
        out, _ = runner.communicate(timeout=60)
    held = json.loads(out.strip().splitlines()[-1])["held"] if out.strip() else []
    with app.app_context():
        defer.run_due(now=datetime.now(UTC) + timedelta(hours=2))  # what is left
        rows = db.session.execute(
            text("SELECT run_at, payload FROM defer_jobs WHERE name = 'digest'")
        ).all()
        starts = db.session.execute(
            text(
                "SELECT j.run_at, min(h.at) FROM defer_jobs j JOIN defer_jobs_history h"
                " ON h.job_id = j.id AND h.event = 'started' GROUP BY j.id"
            )
        ).all()
        db.session.remove()
        db.engine.dispose()
    delivered = [tuple(item) for _, payload in rows for item in json.loads(payload)["items"]]
    expected = options.appenders * options.items - len(errors)
    late = [(_as_time(start) - _as_time(run_at)).total_seconds() for run_at, start in starts]
    print(
        f"{options.appenders} appenders x {options.items} items, window={options.window:g} s, "
        f"max_items={options.max_items}, beside {options.runner} "
        f"({elapsed:.1f} s, {os.cpu_count()} CPUs, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC)"
    )
    print(f"  append + commit   {spread(latencies)}")
    print(f"  failed appends    {len(errors)} {sorted(set(errors))[:3]}")
    print(
        f"  delivered         {len(delivered)} items ({len(set(delivered))} distinct) "
        f"of {expected} appended, in {len(rows)} batches"
    )
    print(f"  batch start late  {spread(late)} (all run {drained:.1f} s after the last append)")
    print(f"  runner's writes   {spread(held)}")


def _as_time(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value.replace(tzinfo=None)
    return datetime.fromisoformat(str(value)).replace(tzinfo=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--appenders", type=int, default=4)
    parser.add_argument("--items", type=int, default=300, help="items per appender")
    parser.add_argument("--window", type=float, default=0.05, help="batch window, s")
    parser.add_argument("--max-items", type=int, default=None)
    parser.add_argument("--pause", type=float, default=0.0, help="sleep between items, s")
    parser.add_argument("--runner", choices=["worker", "run-due"], default="worker")
    parser.add_argument("--busy-timeout", type=float, default=10.0, help="seconds")
    parser.add_argument("--serve", metavar="DATABASE_URL", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.serve:
        serve(options.serve, options.busy_timeout, options.runner)
        return
    with tempfile.TemporaryDirectory() as tmp:
        measure(options, f"sqlite:///{tmp}/bench.sqlite3")


if __name__ == "__main__":
    main()
