"""The benchmark's Flask app: flask_defer wired as an application would wire it.

Used in three ways: in-process by the suites, by ``flask --app bench.app defer ...``
(worker and run-due processes, configured through ``BENCH_DATABASE_URL``), and served
by waitress for the undo-under-load measurement.

The ``/bench/undoable`` and ``/bench/undo/<id>`` routes call ``defer.undoable`` and
``defer.undo``: the calls the blueprint's undo endpoint makes, without its CSRF check and
template rendering. The ``/bench/raw/...`` routes do the same with
hand-written SQL on the same table and session, as the "raw" baseline over HTTP.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Blueprint, Flask, abort, jsonify, request
from flask.typing import ResponseReturnValue
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import DeclarativeBase

from flask_defer import Defer, Job

#: The undo window of the load test: long enough that no job ever runs during it.
UNDO_DELAY = timedelta(seconds=60)

NOOP = "bench_noop"
RECORD_START = "bench_record_start"


class _Model(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=_Model)
defer = Defer(db=db)


@defer.job(NOOP, max_attempts=3)
def bench_noop(job: Job) -> None:
    """The no-op job of the drain measurements."""


@defer.job(RECORD_START, max_attempts=3)
def bench_record_start(job: Job) -> dict[str, float]:
    """Record when the handler started (epoch seconds); the result column keeps it."""
    return {"started": time.time()}


#: The rate-limited job of the workflows measurement, and its limit per second.
RATE_LIMITED = "bench_rate_limited"
RATE_PER_SECOND = 20


@defer.job(RATE_LIMITED, max_attempts=3, rate_limit=f"{RATE_PER_SECOND}/s")
def bench_rate_limited(job: Job) -> None:
    """A no-op held to RATE_PER_SECOND starts a second across workers."""


routes = Blueprint("bench", __name__, url_prefix="/bench")


def _owner() -> str:
    return request.headers.get("X-Bench-Client", "anonymous")


@routes.post("/undoable")
def undoable() -> ResponseReturnValue:
    job = defer.undoable(
        NOOP,
        {"message": request.args.get("n", "0")},
        window=UNDO_DELAY - timedelta(seconds=1),
        owner=_owner(),
        label="Message sent",
    )
    db.session.commit()
    return jsonify(id=job.id)


@routes.post("/undo/<int:job_id>")
def undo(job_id: int) -> ResponseReturnValue:
    # The blueprint's undo endpoint calls exactly this, then renders the outcome.
    return jsonify(undone=defer.undo(job_id, owner=_owner()).undone)


@routes.post("/raw/undoable")
def raw_undoable() -> ResponseReturnValue:
    now = datetime.now(UTC)
    run_at = now + UNDO_DELAY
    params: dict[str, Any] = {
        "name": NOOP,
        "payload": json.dumps({"message": request.args.get("n", "0")}),
        "run_at": param_time(run_at),
        "owner": _owner(),
        "label": "Message sent",
        "undo_until": param_time(run_at - timedelta(seconds=1)),
        "now": param_time(now),
    }
    job_id = db.session.execute(text(_RAW_INSERT[_dialect()]), params).scalar_one()
    db.session.commit()
    return jsonify(id=job_id)


@routes.post("/raw/undo/<int:job_id>")
def raw_undo(job_id: int) -> ResponseReturnValue:
    params = {"id": job_id, "owner": _owner(), "now": param_time(datetime.now(UTC))}
    found = db.session.execute(text(_RAW_CANCEL), params).first()
    if found is None:
        exists = db.session.execute(
            text("SELECT 1 FROM defer_jobs WHERE id = :id AND owner = :owner"), params
        ).first()
        db.session.rollback()
        if exists is None:
            abort(404)
        return jsonify(undone=False)
    db.session.commit()
    return jsonify(undone=True)


_RAW_INSERT = {
    "postgresql": (
        "INSERT INTO defer_jobs (name, queue, payload, status, run_at, due_at, attempts,"
        " max_attempts, owner, label, undo_until, created_at, updated_at)"
        " VALUES (:name, 'default', CAST(:payload AS jsonb), 'pending', :run_at, :run_at, 0,"
        " 3, :owner, :label, :undo_until, :now, :now) RETURNING id"
    ),
    "sqlite": (
        "INSERT INTO defer_jobs (name, queue, payload, status, run_at, due_at, attempts,"
        " max_attempts, owner, label, undo_until, created_at, updated_at)"
        " VALUES (:name, 'default', :payload, 'pending', :run_at, :run_at, 0,"
        " 3, :owner, :label, :undo_until, :now, :now) RETURNING id"
    ),
}
_RAW_CANCEL = (
    "UPDATE defer_jobs SET status = 'cancelled', finished_at = :now, updated_at = :now,"
    " claim_token = NULL, lease_expires_at = NULL"
    " WHERE id = :id AND status = 'pending' AND owner = :owner RETURNING id"
)


def _dialect() -> str:
    return str(db.engine.dialect.name)


def param_time(value: datetime) -> Any:
    """*value* as a bound parameter of the jobs table's time columns."""
    # The table stores naive UTC text on SQLite (flask_defer's UTCDateTime format).
    return time_binder(_dialect())(value)


def sqlite_time(value: datetime) -> str:
    """A UTC datetime in the text format flask_defer stores on SQLite."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def time_binder(backend: str) -> Callable[[datetime], Any]:
    """How a time is bound on *backend*, chosen once (:func:`param_time` asks the app for
    its engine at each call, which was a tenth of the session floors' own Python,
    profiled)."""
    return sqlite_time if backend == "sqlite" else _as_is


def _as_is(value: datetime) -> datetime:
    return value


def create_app(database_url: str | None = None, **config: Any) -> Flask:
    """The bench app on *database_url* (default: ``$BENCH_DATABASE_URL``)."""
    url = database_url or os.environ.get("BENCH_DATABASE_URL")
    if not url:
        raise RuntimeError("set BENCH_DATABASE_URL to the database the bench app should use")
    app = Flask("bench")
    app.config.update(
        SQLALCHEMY_DATABASE_URI=url,
        SQLALCHEMY_ENGINE_OPTIONS={"pool_size": 20, "max_overflow": 40},
        SECRET_KEY="bench",
    )
    # BENCH_APP_DEFER_CLAIM_BATCH=50 and the like: settings for a tuning experiment
    # (the drain runs workers with BENCH_APP_DEFER_HISTORY=false for history off).
    app.config.from_prefixed_env("BENCH_APP")
    app.config.update(config)
    db.init_app(app)
    defer.init_app(app)
    app.register_blueprint(routes)
    with app.app_context():
        _create_tables()
    return app


def _create_tables() -> None:
    """``db.create_all()``, one process at a time: worker processes started together on a
    fresh PostgreSQL database would otherwise race to create the same tables."""
    engine = db.engine
    if engine.dialect.name != "postgresql":
        # SQLite has no advisory lock: a process that lost the race finds the table the
        # winner created (checkfirst) on its next try.
        for attempt in range(5):
            try:
                db.create_all()
                return
            except OperationalError:
                if attempt == 4:
                    raise
                time.sleep(0.1)
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(4242)"))
        db.metadata.create_all(conn)
