"""A small app for the worker-process tests: ``flask --app tests.worker_app defer worker``.

Configured by environment variables, so a test can start real worker processes on its
database: ``WORKER_APP_SQLALCHEMY_DATABASE_URI`` and any ``WORKER_APP_DEFER_*`` key
(values are JSON, e.g. ``WORKER_APP_DEFER_LEASE=2``). The test itself builds the same
app in-process with :func:`create_app` to schedule jobs and read results.

Every handler records its run in ``worker_runs`` (job id, attempt, pid), which is how
the tests count "ran exactly once" and see which process ran what.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import UTC, datetime
from typing import Any

from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import BigInteger, DateTime, Integer, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from flask_defer import Defer, Job, NotYet, RetryAfter


class Model(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Model)
defer = Defer(db=db)


class Run(db.Model):  # type: ignore[name-defined,misc]
    """One handler run: the evidence the tests count."""

    __tablename__ = "worker_runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(BigInteger, index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    pid: Mapped[int] = mapped_column(Integer)
    phase: Mapped[str] = mapped_column(String(20))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


def record(job: Job, phase: str = "ran") -> None:
    """Commit a ``worker_runs`` row at once, so other processes see it mid-handler."""
    db.session.add(
        Run(
            job_id=job.id,
            attempt=job.attempts,
            pid=os.getpid(),
            phase=phase,
            at=datetime.now(UTC),
        )
    )
    db.session.commit()


@defer.job("record")
def record_job(job: Job) -> None:
    record(job)


@defer.job("rate_limited", rate_limit="10/s")
def rate_limited(job: Job) -> None:
    record(job)


@defer.job("slow_first")
def slow_first(job: Job) -> None:
    """Blocks for ``payload["sleep"]`` seconds on its first attempt only."""
    record(job, "started")
    if job.attempts == 1:
        time.sleep(float(job.payload.get("sleep", 60)))
    record(job, "finished")


@defer.job("sleep")
def sleep_job(job: Job) -> str:
    record(job, "started")
    time.sleep(float(job.payload.get("sleep", 1)))
    record(job, "finished")
    return "slept"


@defer.job("not_yet")
def not_yet_job(job: Job) -> None:
    record(job)
    raise NotYet(float(job.payload.get("seconds", 3600)))


@defer.job("retry_after")
def retry_after_job(job: Job) -> None:
    record(job)
    raise RetryAfter(float(job.payload.get("seconds", 120)))




@defer.job("fail_to_file", max_attempts=3)
def fail_to_file(job: Job) -> None:
    """Appends ``id attempt`` to ``payload["file"]`` (outside the database), then fails.

    The evidence of a run must survive a database crash: a row in the database could
    be lost with the crash it is meant to count.
    """
    with open(job.payload["file"], "a", encoding="ascii") as runs_file:
        runs_file.write(f"{job.id} {job.attempts}\n")
    time.sleep(0.005)
    raise RuntimeError("fails on purpose")


def create_app(database_url: str | None = None, **config: Any) -> Flask:
    """The app; Flask's CLI calls this without arguments (environment configuration)."""
    app = Flask("worker_app")
    app.config.update(
        SQLALCHEMY_DATABASE_URI=database_url,
        SQLALCHEMY_ENGINE_OPTIONS={"pool_size": 10, "max_overflow": 10},
        DEFER_RETRY_BASE=1,
    )
    app.config.from_prefixed_env("WORKER_APP")
    app.config.update(config)
    if app.config.get("TEST_LOG"):
        # For `flask run`, where no worker command sets up logging.
        logging.basicConfig(level=logging.INFO, format="%(process)d %(name)s %(message)s")
    if not app.config.get("SQLALCHEMY_DATABASE_URI"):
        raise RuntimeError("set WORKER_APP_SQLALCHEMY_DATABASE_URI")
    every = app.config.get("RECURRING_EVERY")
    if every:
        # A schedule ticking every *every* seconds, recorded like any job.
        defer.recurring("heartbeat", "record", every=float(every), catch_up="all")
    db.init_app(app)
    defer.init_app(app)
    with app.app_context():
        db.create_all()

    @app.get("/schedule/<name>")
    def schedule(name: str) -> dict[str, Any]:
        job = defer.schedule(name)
        db.session.commit()
        return {"id": job.id}

    return app


def runs(app: Flask) -> list[Run]:
    """Every recorded run, oldest first (call without an app context)."""
    with app.app_context():
        return list(db.session.scalars(select(Run).order_by(Run.id)))
