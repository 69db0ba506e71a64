"""What init_app wires for schema versioning (the end of flask_defer/extension.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from flask_defer import Defer


def test_init_app_without_db_in_a_flask_sqlalchemy_app_warns(tmp_path: Path) -> None:
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config["SQLALCHEMY_DATABASE_URI"] = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    SQLAlchemy().init_app(app)
    with pytest.warns(UserWarning, match=r"init_app\(\) got no db"):
        Defer().init_app(app)


def test_init_app_without_db_is_quiet_when_the_separate_database_is_chosen(
    tmp_path: Path, recwarn: pytest.WarningsRecorder
) -> None:
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config["SQLALCHEMY_DATABASE_URI"] = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    app.config["DEFER_DATABASE_URI"] = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    SQLAlchemy().init_app(app)
    Defer().init_app(app)
    assert not [w for w in recwarn if "got no db" in str(w.message)]


def test_defers_own_database_is_created_at_the_newest_revision(tmp_path: Path) -> None:
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    defer = Defer(app)
    with app.app_context():
        status = defer.schema_status()
    assert status.ok and status.managed_by == "flask_defer"
