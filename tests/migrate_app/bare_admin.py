"""An admin app whose metadata has only the app's models, never flask_defer's table.

Like a plain Alembic ``env.py`` importing the models: without the ``include_object``
guard its autogenerate would propose ``op.drop_table('defer_jobs')``.
"""

from __future__ import annotations

import os

from flask import Flask
from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from flask_defer.migrations import include_in


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)


class Note(db.Model):  # type: ignore[name-defined, misc]
    id: Mapped[int] = mapped_column(primary_key=True)
    text: Mapped[str] = mapped_column(String(100))


def create_app(guarded: bool = True) -> Flask:
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = os.environ["DATABASE_URL"]
    db.init_app(app)
    # include_in() brings the guard; the unguarded variant shows what it prevents.
    migrate = Migrate(db=db) if guarded else Migrate(db=db, include_object=_everything)
    include_in(migrate).init_app(app)
    return app


def _everything(*_args: object) -> bool:
    return True


def create_unguarded_app() -> Flask:
    return create_app(guarded=False)
