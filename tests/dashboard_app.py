"""An app with the operator dashboard, wired the way the docs tell an application to.

Flask-Login users; the dashboard (and the metrics) are open to "admin" only, through
``@defer.dashboard_auth`` — the documented example. ``seed()`` fills the table with a
realistic mix: scheduled, due, running, done, failed with a traceback, cancelled,
under several job names. The HTTP tests (both backends), the browser test and the
screenshot all use it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Flask, redirect, request
from flask_login import LoginManager, UserMixin, current_user, login_user, logout_user
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import DeclarativeBase

from flask_defer import Defer, Job
from flask_defer.store import NewJob

USERS = {"admin", "alice"}


class User(UserMixin):
    def __init__(self, name: str) -> None:
        self.id = name


@dataclass
class OpsApp:
    """The app and what the tests reach for."""

    app: Flask
    db: SQLAlchemy
    defer: Defer

    def context(self) -> Any:
        return self.app.app_context()

    def dispose(self) -> None:
        with self.app.app_context():
            self.db.session.remove()
            for engine in self.db.engines.values():
                engine.dispose()

    def job(self, job_id: int) -> Job:
        with self.context():
            job = self.defer.get(job_id)
        assert job is not None
        return job


class BillingUnavailable(ConnectionError):
    pass


def _post_invoices(account: int) -> None:
    raise BillingUnavailable(f"billing API refused the connection (account {account})")


#: The languages the app offers when it uses Flask-Babel (picked from Accept-Language).
LOCALES = ["en", "de", "fr"]


def create_app(
    database_url: str, *, auth: bool = True, babel: bool = False, **config: Any
) -> OpsApp:
    """The app on *database_url*, its tables created; ``auth=False`` registers no hook,
    ``babel=True`` initialises Flask-Babel (the browser's language picks the locale)."""

    class Model(DeclarativeBase):
        pass

    db = SQLAlchemy(model_class=Model)
    defer = Defer()
    app = Flask("ops_app")
    app.config.update(
        SQLALCHEMY_DATABASE_URI=database_url,
        SECRET_KEY="ops-app-secret",
        DEFER_RETRY_BASE=timedelta(seconds=30),
    )
    app.config.update(config)
    db.init_app(app)
    if babel:
        from flask_babel import Babel

        Babel(app, locale_selector=lambda: request.accept_languages.best_match(LOCALES))
    defer.init_app(app, db=db)

    @defer.job("send_email")
    def send_email(job: Job) -> dict[str, Any]:
        return {"delivered_to": job.payload.get("to"), "smtp_id": f"<{job.id}@mail.example>"}

    @defer.job("publish_post")
    def publish_post(job: Job) -> None:
        pass

    @defer.job("close_booking")
    def close_booking(job: Job) -> None:
        pass

    # Its own queue (the Queues page pauses it); no seeded job uses it.
    @defer.job("send_digest", queue="digests")
    def send_digest(job: Job) -> None:
        pass

    @defer.job("sync_invoices", max_attempts=3)
    def sync_invoices(job: Job) -> None:
        _post_invoices(job.payload["account"])

    # Once a year (New Year's Day, 03:00 Berlin): a daily tick fell inside the seeding's
    # run_due horizon one hour a day and added a due job to the counted figures.
    defer.recurring(
        "nightly-invoices", "sync_invoices", cron="0 3 1 1 *", tz="Europe/Berlin",
        payload={"account": 1},
    )

    manager = LoginManager(app)

    @manager.user_loader
    def load_user(user_id: str) -> User | None:
        return User(user_id) if user_id in USERS else None

    if auth:

        @defer.dashboard_auth
        def operators_only() -> bool:
            return bool(current_user.is_authenticated and current_user.id == "admin")

    @app.get("/login/<name>")
    def login(name: str) -> Any:
        if name in USERS:
            login_user(User(name))
        return redirect("/defer/")

    @app.get("/logout")
    def logout() -> Any:
        logout_user()
        return redirect("/")

    with app.app_context():
        db.create_all()
    return OpsApp(app, db, defer)


@dataclass
class Seeded:
    """Ids of the seeded jobs, by what they are."""

    failed: list[int]
    done: list[int]
    cancelled: list[int]
    running: list[int]
    due: list[int]
    scheduled: list[int]


def seed(ops: OpsApp) -> Seeded:
    """A realistic mix of jobs, as a few hours of traffic would leave them.

    Rows are written through the store with times in the past (``schedule()`` would
    clamp a past ``run_at`` to now) and run with ``run_due(now=...)`` at those times,
    so "done 2 h ago" and "due 4 min ago" are what the table really says.
    """
    defer = ops.defer
    with ops.context():
        now = datetime.now(UTC)

        def insert(name: str, payload: dict[str, Any], run_at: datetime, **kw: Any) -> int:
            created = min(run_at, now) - timedelta(seconds=kw.pop("waited", 5))
            kw.setdefault("max_attempts", 5)
            with defer.store.begin() as conn:
                new = NewJob(name=name, payload=payload, run_at=run_at, **kw)
                return defer.store.insert(conn, new, now=created, replace=False).id

        def ago(**delta: float) -> datetime:
            return now - timedelta(**delta)

        # Done: welcome emails and a published post, earlier today.
        done = [
            insert(
                "send_email",
                {"to": f"{who}@example.com", "template": "welcome"},
                ago(hours=hours),
                key=f"user:{n}:welcome",
                owner=who,
                label="Welcome email",
            )
            for n, who, hours in ((101, "maria", 3), (102, "jonas", 2), (103, "li", 1))
        ]
        done.append(insert("publish_post", {"post_id": 88}, ago(minutes=40), key="post:88:publish"))
        for job_id in done:
            defer.run_due(now=ops.job(job_id).run_at + timedelta(seconds=0.2))
        # Failed after all three attempts: a dead letter with its traceback.
        failed = [
            insert(
                "sync_invoices",
                {"account": 4711, "period": "2030-01"},
                ago(hours=2, minutes=30),
                key="account:4711:sync",
                max_attempts=3,
            )
        ]
        for minutes in (0, 10, 20):
            defer.run_due(now=ago(hours=2, minutes=30 - minutes))
        # Cancelled: an undone send, and a booking whose event was called off.
        cancelled = [
            insert(
                "send_email",
                {"to": "sam@example.com", "template": "digest"},
                ago(minutes=25),
                owner="sam",
                label="Sending message",
                waited=6,
            ),
            insert(
                "close_booking",
                {"booking_id": 42},
                now + timedelta(days=2),
                key="booking:42:close",
                waited=3600,
            ),
        ]
        with defer.store.begin() as conn:
            for job_id, minutes in zip(cancelled, (25.1, 8), strict=True):
                defer.store.cancel(conn, now=ago(minutes=minutes), job_id=job_id)
        # Running: a worker holds it right now.
        running = [insert("publish_post", {"post_id": 91}, ago(seconds=3), key="post:91:publish")]
        claimed = defer.store.claim(
            now=now, limit=1, token=uuid.uuid4().hex, lease_until=now + timedelta(seconds=30)
        )
        assert [job.id for job in claimed] == running
        # Due and not started: owed work, the oldest four minutes late.
        due = [
            insert(
                "send_email",
                {"to": f"{who}@example.com", "template": "reminder"},
                ago(minutes=minutes),
                owner=who,
                label="Payment reminder",
            )
            for who, minutes in (("ops", 4), ("kim", 1))
        ]
        # Scheduled: due later, from minutes to days ahead.
        scheduled = [
            insert(
                "publish_post", {"post_id": 93}, now + timedelta(hours=2), key="post:93:publish"
            ),
            insert(
                "close_booking", {"booking_id": 57}, now + timedelta(days=3), key="booking:57:close"
            ),
            insert(
                "send_email",
                {"to": "maria@example.com", "template": "trial-ending"},
                now + timedelta(minutes=12),
                key="user:101:trial-ending",
                owner="maria",
                label="Trial ends soon",
            ),
        ]
    return Seeded(failed, done, cancelled, running, due, scheduled)
