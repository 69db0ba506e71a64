"""Helpers shared by the demo app's HTTP, process and browser tests."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flask import Flask
from flask.testing import FlaskClient

from demo_app import create_app
from demo_app.models import db, defer
from flask_defer import Defer, Job

#: The repository's root: ``python -m demo_app`` runs from here.
ROOT = Path(__file__).resolve().parent.parent

_TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_from(html: str) -> str:
    """The CSRF token of the first form in *html*."""
    match = _TOKEN.search(html)
    assert match, "the page has no form with a CSRF token"
    return match.group(1)


def make_demo(database_url: str, instance_path: Path, **config: Any) -> Flask:
    """The demo app on *database_url*, with no worker thread unless asked for."""
    settings: dict[str, Any] = {
        "SQLALCHEMY_DATABASE_URI": database_url,
        "INSTANCE_PATH": str(instance_path),
        "DEFER_EMBEDDED_WORKER": False,
        "TESTING": True,
    }
    settings.update(config)
    return create_app(settings)


def dispose(app: Flask) -> None:
    """Stop the app's embedded worker (if any) and close its connections."""
    embedded = app.extensions.get("defer.embedded_worker")
    if embedded is not None:
        embedded.stop(timeout=10)
    with app.app_context():
        db.session.remove()
        for engine in db.engines.values():
            engine.dispose()


@dataclass
class Person:
    """One browser-less visitor of the demo: a test client with its own cookies."""

    app: Flask
    client: FlaskClient

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.client.get(path, **kwargs)

    def post(self, path: str, data: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        """POST a form with this person's CSRF token, as a browser would."""
        form = {"csrf_token": self.token(), **(data or {})}
        return self.client.post(path, data=form, **kwargs)

    def token(self) -> str:
        return csrf_from(self.client.get("/sign-in").get_data(as_text=True))

    def sign_in(self, user: str) -> Person:
        response = self.post("/sign-in", {"user": user})
        assert response.status_code == 303, response.get_data(as_text=True)
        return self


@contextmanager
def app_context(app: Flask) -> Iterator[Defer]:
    with app.app_context():
        yield defer


def job_for(app: Flask, key: str) -> Job:
    with app.app_context():
        job = defer.get(key=key)
    assert job is not None, f"no job with key {key!r}"
    return job
