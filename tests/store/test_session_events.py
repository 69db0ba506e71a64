"""Listeners on db.session survive apps and their Session classes coming and going."""

from __future__ import annotations

import gc
from pathlib import Path

from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from flask_defer import Defer, SoftDeleteMixin
from flask_defer.features.soft_delete import _hide_deleted
from flask_defer.store.transactions import clear_uncommitted as _clear_uncommitted


def test_every_new_app_gets_its_session_listeners(tmp_path: Path) -> None:
    # SQLAlchemy keys listeners by id() of the per-factory Session class; after one is
    # collected a new class may reuse its id. Each app must still get its listeners.
    # Only what the loop makes is collected: the rest of the suite's heap is frozen out
    # of the collections, which otherwise cost about a second each late in a full run.
    #
    # The soft-delete query hook is installed only once a SoftDeleteMixin model exists in
    # the process, so one is declared here: this test passed only where an earlier test
    # in the same process had declared one, and failed when run alone.
    class Declared(DeclarativeBase):
        pass

    class Deletable(SoftDeleteMixin, Declared):
        __tablename__ = "session_events_deletable"
        id: Mapped[int] = mapped_column(primary_key=True)

    gc.freeze()
    try:
        for n in range(40):

            class Model(DeclarativeBase):
                pass

            db = SQLAlchemy(model_class=Model)
            app = Flask(f"app_{n}")
            app.config["SQLALCHEMY_DATABASE_URI"] = f"sqlite:///{tmp_path / 'db.sqlite3'}"
            db.init_app(app)
            Defer(app, db=db)
            with app.app_context():
                session = db.session()
                assert _clear_uncommitted in list(session.dispatch.after_transaction_end), n
                assert _hide_deleted in list(session.dispatch.do_orm_execute), n
                db.session.remove()
                db.engine.dispose()
            del app, db, session, Model
            gc.collect()
    finally:
        gc.unfreeze()
