"""Control calls inside the caller's transaction (``commit=False``), on both backends.

The seed case: an offer is accepted, so its expiry job must be cancelled, and both
must happen or neither. ``cancel(..., commit=False)`` runs the guarded statement in
``db.session``'s transaction; the caller's commit makes both real, a rollback leaves
both as they were, and while the transaction is open no runner can start the job.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import Integer, String, select
from sqlalchemy.orm import Mapped, mapped_column

from flask_defer import (
    Defer,
    InvalidArgument,
    Job,
    JobStatus,
    NotConfigured,
    SoftDeleteMixin,
    UndoOutcome,
    job_cancelled,
)
from flask_defer.engine.execution import RunSummary
from flask_defer.timeutil import utcnow

from ..conftest import AppKit


@dataclass
class Shop:
    """An app with an ``offers`` table and an ``expire_offer`` job per offer."""

    kit: AppKit
    offer_model: Any
    project_model: Any
    expired: list[int]

    @property
    def defer(self) -> Defer:
        return self.kit.defer

    def new_offer(self) -> tuple[Any, Job]:
        """An open offer and its pending expiry job, both committed."""
        db = self.kit.db
        offer = self.offer_model(status="open")
        db.session.add(offer)
        db.session.flush()
        job = self.defer.schedule(
            "expire_offer", {"offer": offer.id}, delay=3600, key=f"offer:{offer.id}:expire"
        )
        db.session.commit()
        return offer, job

    def offer_status(self, offer_id: int) -> str:
        """The offer's status as the database has it, read outside db.session."""
        with self.kit.db.engine.connect() as conn:
            table = self.offer_model.__table__
            return str(conn.execute(select(table.c.status).where(table.c.id == offer_id)).scalar())

    def job(self, job_id: int) -> Job:
        """The job as the database has it, read outside db.session."""
        store = self.defer.store
        with store.engine.connect() as conn:
            job = store.get(conn, job_id=job_id)
        assert job is not None
        return job


@pytest.fixture
def shop(make_app: Callable[..., AppKit]) -> Iterator[Shop]:
    kit = make_app()

    class Offer(kit.db.Model):  # type: ignore[name-defined,misc]
        __tablename__ = "offers"
        id: Mapped[int] = mapped_column(Integer, primary_key=True)
        status: Mapped[str] = mapped_column(String(20))

    class Project(kit.db.Model, SoftDeleteMixin):  # type: ignore[name-defined,misc]
        __tablename__ = "projects"
        id: Mapped[int] = mapped_column(Integer, primary_key=True)
        name: Mapped[str] = mapped_column(String(50))

    expired: list[int] = []

    @kit.defer.job("expire_offer")
    def expire_offer(job: Job) -> None:
        expired.append(job.payload["offer"])

    with kit.app.app_context():
        kit.db.create_all()
        yield Shop(kit, Offer, Project, expired)
        kit.db.session.rollback()


def accept(shop: Shop, offer: Any) -> bool:
    """The business change and the cancel it implies, in one transaction (not committed)."""
    offer.status = "accepted"
    shop.kit.db.session.flush()
    return shop.defer.cancel(key=f"offer:{offer.id}:expire", commit=False)


def run_due_in_thread(kit: AppKit, **options: Any) -> tuple[threading.Thread, list[RunSummary]]:
    """``run_due`` in another thread with its own app context (another request, a cron)."""
    results: list[RunSummary] = []

    def run() -> None:
        with kit.app.app_context():
            results.append(kit.defer.run_due(**options))

    thread = threading.Thread(target=run, name="concurrent-run-due")
    thread.start()
    return thread, results


# -- accept and cancel ----------------------------------------------------------------


def test_accept_and_cancel_commit_together(shop: Shop) -> None:
    offer, job = shop.new_offer()

    assert accept(shop, offer) is True  # decided now: this transaction cancelled it
    assert shop.job(job.id).status is JobStatus.PENDING  # not committed yet
    shop.kit.db.session.commit()

    assert shop.job(job.id).status is JobStatus.CANCELLED
    assert shop.offer_status(offer.id) == "accepted"
    assert shop.defer.run_due(now=utcnow() + timedelta(hours=2)).ran == 0
    assert shop.expired == []


def test_accept_and_cancel_roll_back_together(shop: Shop) -> None:
    offer, job = shop.new_offer()
    before = shop.job(job.id)

    assert accept(shop, offer) is True
    shop.kit.db.session.rollback()

    assert shop.job(job.id) == before  # exactly as it was: status, timestamps, all
    assert shop.offer_status(offer.id) == "open"
    assert shop.defer.run_due(now=utcnow() + timedelta(hours=2)).done == 1
    assert shop.expired == [offer.id]


def test_a_concurrent_run_due_does_not_start_the_job_while_the_cancel_is_open(
    shop: Shop, backend: str
) -> None:
    """PostgreSQL: the row is locked, so a runner skips it and returns at once.
    SQLite: the write lock is held, so a runner waits for it, then finds it cancelled."""
    offer, job = shop.new_offer()
    assert accept(shop, offer) is True

    thread, results = run_due_in_thread(shop.kit, now=utcnow() + timedelta(hours=2))
    if backend == "postgresql":
        thread.join(10)
        assert not thread.is_alive()
        assert results[0].ran == 0  # skipped the locked row
        assert shop.job(job.id).status is JobStatus.PENDING
    else:
        thread.join(0.5)
        assert thread.is_alive(), "SQLite: the runner waits for the caller's write lock"
    shop.kit.db.session.commit()
    thread.join(10)
    assert not thread.is_alive()
    assert results[0].ran == 0
    assert shop.expired == []
    assert shop.job(job.id).status is JobStatus.CANCELLED


def test_a_runner_takes_the_job_once_the_caller_rolls_back(shop: Shop, backend: str) -> None:
    offer, job = shop.new_offer()
    assert accept(shop, offer) is True
    later = utcnow() + timedelta(hours=2)

    thread, results = run_due_in_thread(shop.kit, now=later)
    thread.join(10 if backend == "postgresql" else 0.5)
    assert thread.is_alive() is (backend == "sqlite")
    shop.kit.db.session.rollback()
    thread.join(10)
    assert not thread.is_alive()
    if backend == "postgresql":
        assert results[0].ran == 0  # it had skipped the row; the next run takes it
        assert shop.defer.run_due(now=later).done == 1
    else:
        assert results[0].done == 1  # it had waited for the lock, then claimed it
    assert shop.expired == [offer.id]
    assert shop.job(job.id).status is JobStatus.DONE


def test_cancel_of_a_running_job_in_the_caller_transaction_returns_false(shop: Shop) -> None:
    offer, job = shop.new_offer()
    store = shop.defer.store
    now = utcnow() + timedelta(hours=2)
    [claimed] = store.claim(now=now, limit=1, token="t", lease_until=now + timedelta(minutes=1))

    assert accept(shop, offer) is False  # in flight: this transaction cancelled nothing
    shop.kit.db.session.commit()
    assert shop.job(job.id).status is JobStatus.RUNNING
    store.release([claimed], now=now)


# -- the uncommitted-jobs guard, and the lock this holds --------------------------------


def test_commit_false_is_allowed_while_the_session_holds_uncommitted_jobs(shop: Shop) -> None:
    defer = shop.defer
    job = defer.schedule("expire_offer", {"offer": 0}, delay=60, key="offer:0:expire")
    with pytest.raises(NotConfigured, match="commit"):
        defer.cancel(job.id)  # its own transaction would wait for this one's lock

    assert defer.cancel(job.id, commit=False) is True  # the same transaction: fine
    shop.kit.db.session.commit()
    assert shop.job(job.id).status is JobStatus.CANCELLED


def test_an_own_transaction_call_after_a_commit_false_one_refuses_instead_of_waiting(
    shop: Shop,
) -> None:
    first_offer, first = shop.new_offer()
    _, second = shop.new_offer()
    assert accept(shop, first_offer) is True
    # The caller's transaction holds a lock a call in its own transaction would wait
    # for (SQLite's write lock; on PostgreSQL, forever for the same row).
    with pytest.raises(NotConfigured, match=r"db.session.commit\(\) first"):
        shop.defer.cancel(second.id)
    shop.kit.db.session.commit()
    assert shop.defer.cancel(second.id) is True
    assert shop.job(first.id).status is JobStatus.CANCELLED


# -- every control call ------------------------------------------------------------------


def failed_job(shop: Shop) -> Job:
    """A job that ran out of attempts (a dead letter)."""
    store = shop.defer.store
    job = shop.defer.schedule("expire_offer", {"offer": 0})
    shop.kit.db.session.commit()
    now = utcnow()
    [claimed] = store.claim(now=now, limit=1, token="t", lease_until=now + timedelta(minutes=1))
    assert store.ack_failed(claimed, now=now, error="boom")
    return job


CONTROL_CALLS: dict[str, Callable[[Shop, Job], Any]] = {
    "cancel": lambda shop, job: shop.defer.cancel(job.id, commit=False),
    "cancel_many": lambda shop, job: shop.defer.cancel_many(
        key_prefix=job.key, commit=False
    ),
    "reschedule": lambda shop, job: shop.defer.reschedule(
        job.id, delay=timedelta(days=3), commit=False
    ),
    "run_now": lambda shop, job: shop.defer.run_now(job.id, commit=False),
    "retry": lambda shop, job: shop.defer.retry(job.id, commit=False),
    "undo": lambda shop, job: shop.defer.undo(job.id, commit=False),
}


@pytest.mark.parametrize("name", sorted(CONTROL_CALLS))
@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_each_control_call_joins_the_caller_transaction(
    shop: Shop, name: str, outcome: str
) -> None:
    job = failed_job(shop) if name == "retry" else shop.new_offer()[1]
    before = shop.job(job.id)

    CONTROL_CALLS[name](shop, job)
    assert shop.job(job.id) == before  # nothing committed by the call itself
    getattr(shop.kit.db.session, outcome)()

    after = shop.job(job.id)
    if outcome == "rollback":
        assert after == before
        return
    if name == "retry":
        assert (after.status, after.attempts) == (JobStatus.PENDING, 0)
    elif name == "reschedule":
        assert after.status is JobStatus.PENDING and after.run_at > before.run_at
    elif name == "run_now":
        assert after.status is JobStatus.PENDING and after.run_at < before.run_at
    else:
        assert after.status is JobStatus.CANCELLED


def test_commit_must_be_true_or_false(shop: Shop) -> None:
    _, job = shop.new_offer()
    with pytest.raises(InvalidArgument) as refused:
        shop.defer.cancel(job.id, commit="no")  # type: ignore[arg-type]
    assert refused.value.argument == "commit"
    assert shop.job(job.id).status is JobStatus.PENDING


def test_commit_false_without_a_db_is_refused_naming_commit(tmp_path: Path) -> None:
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    defer = Defer(app)
    defer.job("ping")(lambda job: None)
    calls: list[Callable[[int], Any]] = [
        lambda i: defer.cancel(i, commit=False),
        lambda i: defer.cancel_many(key_prefix="k", commit=False),
        lambda i: defer.reschedule(i, delay=5, commit=False),
        lambda i: defer.run_now(i, commit=False),
        lambda i: defer.retry(i, commit=False),
        lambda i: defer.undo(i, commit=False),
    ]
    with app.app_context():
        job = defer.schedule("ping", key="k")
        try:
            for call in calls:
                with pytest.raises(InvalidArgument, match="has no db") as refused:
                    call(job.id)
                assert refused.value.argument == "commit"
            assert defer.get(job.id).status is JobStatus.PENDING  # type: ignore[union-attr]
        finally:
            defer.store.engine.dispose()


# -- signals ----------------------------------------------------------------------------


def test_job_cancelled_is_sent_after_the_commit_and_never_on_rollback(shop: Shop) -> None:
    heard: list[int] = []
    first_offer, first = shop.new_offer()
    second_offer, second = shop.new_offer()
    with job_cancelled.connected_to(lambda app, job: heard.append(job.id)):
        assert accept(shop, first_offer) is True
        assert heard == []  # not real yet
        shop.kit.db.session.commit()
        assert heard == [first.id]

        assert accept(shop, second_offer) is True
        shop.kit.db.session.rollback()
        shop.kit.db.session.commit()  # a later commit does not resurrect it
        assert heard == [first.id]


def test_a_savepoint_release_does_not_send_the_signal_early(shop: Shop) -> None:
    heard: list[int] = []
    offer, job = shop.new_offer()
    session = shop.kit.db.session
    with job_cancelled.connected_to(lambda app, job: heard.append(job.id)):
        with session.begin_nested():
            assert accept(shop, offer) is True
        assert heard == []  # the savepoint is released; the transaction is still open
        session.commit()
    assert heard == [job.id]


# -- undo with an on_undo hook: soft delete ----------------------------------------------


def test_undo_commit_false_of_a_soft_delete_rolls_back_whole(shop: Shop) -> None:
    Project = shop.project_model
    db = shop.kit.db
    project = Project(name="apollo")
    db.session.add(project)
    db.session.commit()
    purge = shop.defer.soft_delete(project, owner="ada")
    db.session.commit()
    project_id = project.id

    def deleted_at() -> Any:
        with db.engine.connect() as conn:
            table = Project.__table__
            return conn.execute(
                select(table.c.deleted_at).where(table.c.id == project_id)
            ).scalar()

    def visible() -> bool:
        found = db.session.scalars(select(Project).where(Project.id == project_id)).first()
        return found is not None

    assert shop.defer.undo(purge.id, owner="ada", commit=False) is UndoOutcome.UNDONE
    # In this transaction the row is back (the hook ran in it) ...
    assert visible()
    db.session.rollback()
    # ... and the rollback takes back both the hook's restore and the cancel.
    assert shop.job(purge.id).status is JobStatus.PENDING
    assert deleted_at() is not None
    assert not visible()

    assert shop.defer.undo(purge.id, owner="ada", commit=False) is UndoOutcome.UNDONE
    db.session.commit()
    assert shop.job(purge.id).status is JobStatus.CANCELLED
    assert deleted_at() is None


def test_undo_commit_false_leaves_the_rollback_to_the_caller_when_a_hook_raises(
    shop: Shop,
) -> None:
    offer, job = shop.new_offer()

    @shop.defer.on_undo("expire_offer")
    def refuse(job: Job) -> None:
        raise RuntimeError("hook failed")

    offer.status = "withdrawn"
    shop.kit.db.session.flush()
    with pytest.raises(RuntimeError, match="hook failed"):
        shop.defer.undo(job.id, commit=False)
    session = shop.kit.db.session
    # Nothing was rolled back for the caller: its transaction holds its own change
    # and the cancel (read through db.session), until it rolls back.
    assert session().in_transaction()
    assert shop.defer.get(job.id).status is JobStatus.CANCELLED  # type: ignore[union-attr]
    assert session.get(shop.offer_model, offer.id).status == "withdrawn"
    session.rollback()
    assert shop.job(job.id).status is JobStatus.PENDING
    assert shop.offer_status(offer.id) == "open"
