"""``Fail``: a handler ends its job as a dead letter at once, attempts left or not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from flask_defer import Fail, Job, JobStatus, job_failed

from ..conftest import AppKit


def later() -> datetime:
    return datetime.now(UTC) + timedelta(seconds=1)


def test_fail_settles_the_job_without_retries(kit: AppKit) -> None:
    @kit.defer.job("charge", max_attempts=5)
    def charge(job: Job) -> None:
        raise Fail("card declined: do not try again")

    seen: list[dict[str, Any]] = []

    def on_failed(sender: Any, **extra: Any) -> None:
        seen.append(extra)

    job = kit.defer.schedule("charge")
    kit.db.session.commit()
    with job_failed.connected_to(on_failed):
        summary = kit.defer.run_due(now=later())
    assert summary.failed == 1 and summary.retried == 0
    failed = kit.defer.get(job.id)
    assert failed.status is JobStatus.FAILED and failed.attempts == 1
    assert "card declined: do not try again" in failed.last_error
    assert seen and seen[0]["will_retry"] is False


def test_fail_in_an_atomic_handler_rolls_its_work_back(make_app: Any) -> None:
    kit: AppKit = make_app()

    class Note(kit.db.Model):  # type: ignore[name-defined, misc]
        __tablename__ = "notes"
        id: Mapped[int] = mapped_column(primary_key=True)
        text: Mapped[str] = mapped_column(String(50))

    @kit.defer.job("write", atomic=True)
    def write(job: Job) -> None:
        kit.db.session.add(Note(text="half done"))
        kit.db.session.flush()
        raise Fail("refused")

    with kit.app.app_context():
        kit.db.create_all()
        job = kit.defer.schedule("write")
        kit.db.session.commit()
        kit.defer.run_due(now=later())
        assert kit.defer.get(job.id).status is JobStatus.FAILED
        assert kit.db.session.query(Note).count() == 0


def test_other_errors_still_retry(kit: AppKit) -> None:
    @kit.defer.job("flaky", max_attempts=3)
    def flaky(job: Job) -> None:
        raise RuntimeError("try again")

    job = kit.defer.schedule("flaky")
    kit.db.session.commit()
    kit.defer.run_due(now=later())
    assert kit.defer.get(job.id).status is JobStatus.PENDING
