"""flask_defer as the contender: enqueue through the facade, drain through ``run_due``.

Draining in *P* processes spawns *P* fresh interpreters that build the bench app, wait
at a barrier until all are connected, then call ``defer.run_due()``; the figure is all
jobs over the span from the first process's start to the last one's end, so process
start-up is not counted (as it would not be for a long-running worker).
"""

from __future__ import annotations

import multiprocessing
import time
from datetime import timedelta
from typing import Any

from flask import Flask

from .app import NOOP, create_app, db, defer
from .env import Database
from .plain import insert_each_through
from .results import Sample


class FlaskDeferApp:
    """The bench app on one database, kept for every round of a contender."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self.app: Flask = create_app(database.url)

    def enqueue_each(self, count: int, delay_seconds: float) -> int:
        delay = timedelta(seconds=delay_seconds)
        with self.app.app_context():
            for n in range(count):
                defer.schedule(NOOP, {"n": n}, delay=delay)
                db.session.commit()
        return count

    def session_insert_each(self, count: int, delay_seconds: float) -> int:
        """The floor of any library that joins ``db.session``: the raw INSERT of
        :func:`bench.raw.sqlite_insert` (and its PostgreSQL twin) as SQL text through the
        app's session, one commit each. No target names it; it shows what the session
        costs before ``schedule()`` does anything (on SQLite the app's engine also takes
        flask_defer's write lock in turn, as every write transaction of the app does)."""
        with self.app.app_context():
            return insert_each_through(db.session, self.database.backend, count, delay_seconds)

    def enqueue_bulk(self, count: int, delay_seconds: float) -> int:
        with self.app.app_context():
            written = defer.schedule_many(
                NOOP, [{"n": n} for n in range(count)], delay=delay_seconds
            )
            db.session.commit()
        return written

    def run_due(self) -> int:
        with self.app.app_context():
            return defer.run_due().ran

    def close(self) -> None:
        with self.app.app_context():
            db.session.remove()
            db.engine.dispose()


def drain_in_processes(database: Database, processes: int) -> Sample:
    """Run ``defer.run_due()`` in *processes* fresh interpreters at once."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(processes + 1)
    results: Any = context.Queue()
    children = [
        context.Process(target=_run_due_child, args=(database.url, barrier, results))
        for _ in range(processes)
    ]
    for child in children:
        child.start()
    try:
        barrier.wait(timeout=120)
        spans = [results.get(timeout=900) for _ in children]
    finally:
        for child in children:
            child.join(timeout=60)
            if child.is_alive():
                child.kill()
    errors = [span for span in spans if isinstance(span, str)]
    if errors:
        raise RuntimeError(errors[0])
    start = min(span[0] for span in spans)
    end = max(span[1] for span in spans)
    return Sample(sum(span[2] for span in spans), end - start)


def _run_due_child(url: str, barrier: Any, results: Any) -> None:
    try:
        app = create_app(url)
        with app.app_context():
            defer.store.next_run_at()  # connect before the clock starts
            barrier.wait(timeout=120)
            start = time.monotonic()
            ran = defer.run_due().ran
            end = time.monotonic()
        results.put((start, end, ran))
    except Exception as error:  # noqa: BLE001 - reported by the parent
        results.put(f"run_due child failed: {type(error).__name__}: {error}")


def schedule_spread(fd: FlaskDeferApp, count: int, spread: tuple[float, float], seed: int) -> None:
    """Schedule *count* start-recording jobs due in uniform(*spread*) seconds, one commit each."""
    import random

    from .app import RECORD_START

    rng = random.Random(seed)
    with fd.app.app_context():
        for n in range(count):
            defer.schedule(RECORD_START, {"n": n}, delay=rng.uniform(*spread))
            db.session.commit()


def start_latencies(fd: FlaskDeferApp) -> tuple[list[float], int]:
    """Seconds from each finished start-recording job's ``run_at`` to its handler's start."""
    from .app import RECORD_START

    with fd.app.app_context():
        jobs = defer.list(name=RECORD_START, limit=10_000)
    late = [
        job.result["started"] - job.run_at.timestamp()
        for job in jobs
        if job.status.value == "done" and isinstance(job.result, dict)
    ]
    return late, len(jobs)
