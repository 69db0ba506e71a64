"""flask_defer's demo: a small app that uses every feature the way an application would.

``python -m demo_app`` (or ``make demo``) serves it at http://127.0.0.1:5000 on SQLite,
with the embedded worker running the jobs. With ``DATABASE_URL`` set it uses that
database instead and expects a separate ``flask --app demo_app defer worker``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from flask import Flask, current_app, redirect, render_template, url_for
from flask_wtf.csrf import CSRFError, CSRFProtect
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from werkzeug.routing import BuildError

from . import jobs  # noqa: F401  (registers the job handlers on `defer`)
from .models import Notification, db, defer
from .seed import seed
from .users import USERS, current_user, require_sign_in
from .when import countdown_tag, local_input_value, time_tag

#: The demo's own settings; tests shorten the windows.
DEMO_DEFAULTS: dict[str, Any] = {
    # How long the Undo toast of a sent message shows.
    "DEMO_MAIL_UNDO_WINDOW": timedelta(seconds=5),
    # How long a deleted project can be restored before it is gone for good.
    "DEMO_DELETE_GRACE": timedelta(seconds=30),
    # Comments on a post within this long after the first become one notification.
    "DEMO_BATCH_WINDOW": timedelta(minutes=1),
    # Fill an empty database with a few projects and posts.
    "DEMO_SEED": True,
}

#: The demo settings that are durations; each can also be set in the environment.
DEMO_DURATIONS = ("DEMO_MAIL_UNDO_WINDOW", "DEMO_DELETE_GRACE", "DEMO_BATCH_WINDOW")

csrf = CSRFProtect()


def _seconds_from_env(name: str, text: str) -> timedelta:
    """A positive number of seconds from the environment, or a message naming *name*."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 366 * 24 * 3600:
        raise ValueError(f"{name} must be a number of seconds greater than 0, got {text!r}")
    return timedelta(seconds=seconds)


def database_url_from_env() -> str | None:
    """``DATABASE_URL`` as SQLAlchemy wants it (psycopg 3 for PostgreSQL), or None."""
    url = os.environ.get("DATABASE_URL", "").strip()
    if not url:
        return None
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url.removeprefix(prefix)
    return url


def _flag(name: str) -> bool | None:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return None
    return value in {"1", "true", "yes", "on"}


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    """The demo app. *config* overrides any setting (tests pass short windows)."""
    overrides = dict(config or {})
    instance_path = overrides.pop("INSTANCE_PATH", None) or os.environ.get("DEMO_INSTANCE_PATH")
    app = Flask(__name__, instance_path=os.path.abspath(instance_path) if instance_path else None)
    os.makedirs(app.instance_path, exist_ok=True)

    database_url = database_url_from_env()
    embedded = _flag("DEFER_EMBEDDED_WORKER")
    app.config.update(DEMO_DEFAULTS)
    app.config.update(
        # A demo bound to 127.0.0.1; set DEMO_SECRET_KEY anywhere else.
        SECRET_KEY=os.environ.get("DEMO_SECRET_KEY", "flask-defer-demo-not-a-secret"),
        SQLALCHEMY_DATABASE_URI=database_url
        or "sqlite:///" + os.path.join(app.instance_path, "demo.sqlite3"),
        # SQLite: one command, the worker runs inside the web process. With a
        # DATABASE_URL, run `flask --app demo_app defer worker` beside it instead.
        DEFER_EMBEDDED_WORKER=embedded if embedded is not None else database_url is None,
        # Scheduled HTTP calls (the Automation page) may only go to the demo itself.
        DEFER_HTTP_ALLOWED_HOSTS=["127.0.0.1", "localhost"],
        # The demo calls its own webhook on this machine: a loopback address, which
        # scheduled calls refuse unless the app allows it (development only).
        DEFER_HTTP_ALLOWED_NETWORKS=["127.0.0.0/8", "::1/128"],
    )
    # The windows can be changed from the environment, in seconds
    # (DEMO_DELETE_GRACE=10 python -m demo_app); create_app(config) still wins.
    for name in DEMO_DURATIONS:
        from_env = os.environ.get(name, "").strip()
        if from_env:
            app.config[name] = _seconds_from_env(name, from_env)
    app.config.update(overrides)
    for name in DEMO_DURATIONS:
        value = app.config[name]
        if not isinstance(value, timedelta):
            app.config[name] = timedelta(seconds=float(value))

    db.init_app(app)
    csrf.init_app(app)  # flask_defer's Undo then uses Flask-WTF's token too
    defer.init_app(app)

    from . import automation, language, mail, posts, projects, users

    language.init_app(app)  # Flask-Babel, with the reader's language for flask_defer's texts

    app.register_blueprint(users.bp)
    app.register_blueprint(mail.bp)
    app.register_blueprint(projects.bp)
    app.register_blueprint(posts.bp)
    app.register_blueprint(posts.notifications_bp)
    app.register_blueprint(automation.bp)
    # The worker's POST to the demo's own webhook carries a signature, not a form token.
    csrf.exempt(automation.webhook)
    app.before_request(require_sign_in)
    app.add_template_filter(time_tag, "time")
    app.add_template_filter(countdown_tag, "countdown")
    app.add_template_filter(local_input_value, "local_input")
    app.context_processor(_layout_context)

    @app.get("/")
    def home() -> Any:
        return redirect(url_for("mail.index"))

    @app.errorhandler(CSRFError)
    def csrf_failed(error: CSRFError) -> Any:
        return render_template("error.html", title="Form expired", error=error), 400

    @app.errorhandler(404)
    def not_found(error: Any) -> Any:
        return render_template("error.html", title="Not found", error=error), 404

    _show_handler_logs()
    _create_tables(app)
    return app


def _show_handler_logs() -> None:
    """Let the handlers' lines ("delivered message 7 ...") reach the terminal.

    ``python -m demo_app`` configures logging itself; under ``flask run`` or
    ``flask defer worker`` nobody does, so the demo's logger gets a handler of its own.
    """
    logger = logging.getLogger("demo_app")
    logger.setLevel(logging.INFO)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s %(message)s"))
        logger.addHandler(handler)


def _create_tables(app: Flask) -> None:
    """Create the tables (the jobs table included) and the demo data, once."""
    with app.app_context():
        for attempt in range(3):
            try:
                db.create_all()
                if app.config["DEMO_SEED"]:
                    seed()
                return
            except SQLAlchemyError:
                # The web app and a worker starting together on an empty PostgreSQL
                # database race to create the same tables: the loser tries again.
                db.session.rollback()
                if attempt == 2:
                    raise
                time.sleep(0.5)


def _layout_context() -> dict[str, Any]:
    user = current_user()
    unread = 0
    if user is not None:
        unread = (
            db.session.scalar(
                select(func.count())
                .select_from(Notification)
                .where(Notification.user == user.id, Notification.read.is_(False))
            )
            or 0
        )
    return {
        "user": user,
        "users": USERS,
        "unread": unread,
        "dashboard_url": _dashboard_url(),
        "embedded_worker": current_app.config["DEFER_EMBEDDED_WORKER"],
    }


def _dashboard_url() -> str | None:
    """The operator dashboard's URL, when this version of flask_defer has one."""
    if "defer.dashboard" not in current_app.view_functions:
        return None
    try:
        return url_for("defer.dashboard")
    except BuildError:
        return None


# -- flask_defer hooks: who owns a job, who may open the dashboard --------------------


@defer.owner_loader
def _owner() -> str | None:
    """Jobs a signed-in demo user causes are theirs: they alone see and undo them."""
    user = current_user()
    return user.id if user is not None else None


def _dashboard_allowed() -> bool:
    # A real app would check for an operator role; in the demo, any signed-in user.
    return current_user() is not None


if callable(getattr(defer, "dashboard_auth", None)):
    defer.dashboard_auth(_dashboard_allowed)
