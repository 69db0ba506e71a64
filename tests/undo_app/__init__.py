"""A small mail app using the Undo UI the way an application would.

The HTTP tests (both backends) and the browser tests run against it: a compose page
whose Send button schedules an undoable ``send_email`` job (plain form POST, or htmx),
a second page to navigate to, and optional Flask-Login / Flask-WTF wiring.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from flask import Flask, redirect, render_template, request, url_for
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import DeclarativeBase

from flask_defer import Defer, Fail, Job

TEMPLATES = Path(__file__).parent / "templates"
#: The locales the app offers (Flask-Babel picks one from Accept-Language).
LOCALES = ["en", "de", "fr"]
#: The toast's state texts the compose form may pass to undoable().
STATE_TEXTS = ("waiting_label", "done_label", "failed_label", "undone_label")


@dataclass
class MailApp:
    """The app and what the tests look at."""

    app: Flask
    db: SQLAlchemy
    defer: Defer
    sent: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def context(self) -> Any:
        return self.app.app_context()

    def dispose(self) -> None:
        with self.app.app_context():
            self.db.session.remove()
            for engine in self.db.engines.values():
                engine.dispose()


def create_app(
    database_url: str,
    *,
    login: bool = False,
    flask_wtf: bool = False,
    template_folder: Path | None = None,
    babel: bool = True,
    **config: Any,
) -> MailApp:
    """Build the mail app on *database_url*, its tables created."""

    class Model(DeclarativeBase):
        pass

    db = SQLAlchemy(model_class=Model)
    defer = Defer()
    app = Flask(
        "undo_mail_app",
        template_folder=str(template_folder or TEMPLATES),
        root_path=str(Path(__file__).parent),
    )
    app.config.update(
        SQLALCHEMY_DATABASE_URI=database_url,
        SECRET_KEY="mail-app-secret",
        DEFER_UNDO_WINDOW=timedelta(seconds=5),
    )
    app.config.update(config)
    db.init_app(app)
    if flask_wtf:
        from flask_wtf.csrf import CSRFProtect

        CSRFProtect(app)
    if babel:
        from flask_babel import Babel

        Babel(app, locale_selector=lambda: request.accept_languages.best_match(LOCALES))
    defer.init_app(app, db=db)
    mail = MailApp(app, db, defer)

    @defer.job("send_email")
    def send_email(job: Job) -> None:
        if job.payload.get("subject") == "FAIL":
            raise Fail("the mail server refused the message")
        with mail.lock:
            mail.sent.append(dict(job.payload))

    if login:
        _add_login(app)

    @app.get("/")
    def compose() -> str:
        return render_template("compose.html")

    @app.get("/inbox")
    def inbox() -> str:
        return render_template("inbox.html")

    @app.post("/send")
    def send() -> Any:
        subject = request.form.get("subject") or "Hello"
        window = request.form.get("window")
        job = defer.undoable(
            "send_email",
            {"subject": subject},
            label=request.form.get("label") or "Message sent",
            window=float(window) if window else None,
            key=request.form.get("key") or None,
            replace=request.form.get("replace") == "1",
            **{name: request.form[name] for name in STATE_TEXTS if request.form.get(name)},
        )
        db.session.commit()
        if request.headers.get("HX-Request") == "true":
            return "", 204
        keep = {name: request.form[name] for name in STATE_TEXTS if request.form.get(name)}
        return redirect(
            url_for("compose", sent=job.id, window=window or None, **keep), code=303
        )

    with app.app_context():
        db.create_all()
    return mail


def _add_login(app: Flask) -> None:
    from flask_login import LoginManager, UserMixin, login_user, logout_user

    class User(UserMixin):
        def __init__(self, name: str) -> None:
            self.id = name

    manager = LoginManager(app)

    @manager.user_loader
    def load(user_id: str) -> User | None:
        return User(user_id) if user_id in {"alice", "bob"} else None

    @app.get("/login/<name>")
    def login(name: str) -> Any:
        login_user(User(name))
        return redirect(url_for("compose"))

    @app.get("/logout")
    def logout() -> Any:
        logout_user()
        return redirect(url_for("compose"))
