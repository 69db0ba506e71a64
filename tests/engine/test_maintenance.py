"""Maintenance: the reclaim step that the worker and ``run_due`` share."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import Integer
from sqlalchemy.orm import Mapped, mapped_column

from flask_defer import JobStatus
from flask_defer.engine.maintenance import reclaim_lapsed
from flask_defer.timeutil import utcnow

from ..conftest import AppKit


def test_reclaim_returns_lapsed_leases_and_leaves_live_ones(kit: AppKit) -> None:
    kit.defer.job("work")(lambda job: None)
    dead = kit.defer.schedule("work")
    live = kit.defer.schedule("work")
    kit.db.session.commit()
    now = utcnow()
    store = kit.defer.store
    store.claim(now=now, limit=1, token="dead", lease_until=now - timedelta(seconds=1))
    store.claim(now=now, limit=1, token="live", lease_until=now + timedelta(minutes=1))

    assert reclaim_lapsed(store, utcnow) == 1

    assert kit.defer.get(dead.id).status is JobStatus.PENDING  # type: ignore[union-attr]
    assert kit.defer.get(live.id).status is JobStatus.RUNNING  # type: ignore[union-attr]
    assert reclaim_lapsed(store, utcnow) == 0


def test_reclaim_with_nothing_lapsed_takes_no_write_lock(
    make_app: Callable[..., AppKit],
) -> None:
    """It looks before it locks, as the claim does: a cron run with nothing to reclaim
    never waits for a request's open write transaction (SQLite) nor takes the
    maintenance lock (PostgreSQL)."""
    kit = make_app(DEFER_SQLITE_BUSY_TIMEOUT=0.5)

    class Note(kit.db.Model):  # type: ignore[name-defined,misc]
        __tablename__ = "notes"
        id: Mapped[int] = mapped_column(Integer, primary_key=True)

    results: list[int | None] = []
    with kit.app.app_context():
        store = kit.defer.store

    def cron() -> None:
        results.append(reclaim_lapsed(store, utcnow))

    with kit.app.app_context():
        kit.db.create_all()
        kit.db.session.add(Note())
        kit.db.session.flush()  # a request's write transaction, still open
        thread = threading.Thread(target=cron, name="cron")
        thread.start()
        thread.join(10)
        kit.db.session.rollback()
    assert results == [0]
