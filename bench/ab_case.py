"""One measurement of whichever flask_defer is first on ``PYTHONPATH`` (see :mod:`bench.ab`).

``python -m bench.ab_case URL enqueue|drain|schedule|bulk|batch N`` prints one figure:

* ``enqueue``: jobs/s of ``schedule()`` + ``db.session.commit()``, one by one;
* ``drain``: jobs/s of a burst worker (4 threads) over N due no-op jobs;
* ``schedule``: µs of one ``schedule()`` before its commit (the Python cost);
* ``bulk``: jobs/s of ``schedule_many()`` of N payloads + commit, median of 5;
* ``batch``: items/s of ``defer.batch()`` + ``db.session.commit()``, one by one, to one
  key (batches of at most 50 items: each full batch opens the next).

URL is ``sqlite`` (a fresh file) or a PostgreSQL URL (a fresh table in it).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import uuid

from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import DeclarativeBase

from flask_defer import Defer, Job


class Base(DeclarativeBase):
    pass


def main(backend: str, what: str, n: int) -> float:
    url = f"sqlite:///{tempfile.mkdtemp()}/ab.sqlite3" if backend == "sqlite" else backend
    app = Flask("ab")
    app.config.update(SQLALCHEMY_DATABASE_URI=url, SECRET_KEY="ab")
    db = SQLAlchemy(app, model_class=Base)
    table = f"ab_{uuid.uuid4().hex[:8]}"
    defer = Defer(app, db=db, table_name=table, schedules_table_name=table + "_schedules")

    @defer.job("noop")
    def noop(job: Job) -> None:
        pass

    with app.app_context():
        db.create_all()
        try:
            return _measure(defer, db, what, n)
        finally:
            db.session.rollback()
            db.drop_all()
            db.session.remove()
            db.engine.dispose()


def _measure(defer: Defer, db: SQLAlchemy, what: str, n: int) -> float:
    if what == "schedule":
        samples = []
        for _ in range(7):
            began = time.perf_counter()
            for i in range(n):
                defer.schedule("noop", {"i": i}, delay=3600)
            samples.append((time.perf_counter() - began) / n * 1e6)
            db.session.commit()
        return statistics.median(samples[1:])  # the first warms the caches
    if what == "enqueue":
        for i in range(100):  # warm-up
            defer.schedule("noop", {"i": i}, delay=3600)
            db.session.commit()
        began = time.perf_counter()
        for i in range(n):
            defer.schedule("noop", {"i": i}, delay=3600)
            db.session.commit()
        return n / (time.perf_counter() - began)
    if what == "batch":
        for i in range(100):  # warm-up
            defer.batch("noop", key="warm-up", item=i, window=3600, max_items=50)
            db.session.commit()
        began = time.perf_counter()
        for i in range(n):
            defer.batch("noop", key="post:1", item={"i": i}, window=3600, max_items=50)
            db.session.commit()
        return n / (time.perf_counter() - began)
    if what == "bulk":
        rates = []
        for _ in range(6):
            payloads = [{"i": i} for i in range(n)]
            began = time.perf_counter()
            defer.schedule_many("noop", payloads, delay=3600)
            db.session.commit()
            rates.append(n / (time.perf_counter() - began))
        return statistics.median(rates[1:])  # the first warms the caches
    defer.schedule_many("noop", [{"i": i} for i in range(n)])
    db.session.commit()
    worker = defer.worker(burst=True, concurrency=4)
    began = time.perf_counter()
    worker.run(install_signal_handlers=False)
    took = time.perf_counter() - began
    left = defer.count(status="pending")
    db.session.commit()
    if left:
        raise SystemExit(f"{left} jobs left")
    return n / took


if __name__ == "__main__":
    print(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
