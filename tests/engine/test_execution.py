"""Handler pathologies the executor must survive: each run recorded once, clearly.

Every test runs on SQLite and PostgreSQL (the ``kit`` fixture) through ``run_due``,
which is the worker's own claim → execute → acknowledge code.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import String, select
from sqlalchemy.orm import Mapped, mapped_column

from flask_defer import Job, JobStatus, RetryAfter
from flask_defer.engine.execution import error_summary

from ..conftest import AppKit


def later() -> datetime:
    return datetime.now(UTC) + timedelta(seconds=1)


def settle(kit: AppKit, job: Job) -> Job:
    """Run what is due (repeatedly, as retries fall due) and return the job as stored."""
    for hours in range(1, 6):
        kit.defer.run_due(now=datetime.now(UTC) + timedelta(hours=hours * 2))
    stored = kit.defer.get(job.id)
    assert stored is not None
    return stored


@pytest.mark.parametrize("text", ["nul\x00", "lone \ud800"])
def test_a_result_the_database_cannot_store_fails_the_job_once(kit: AppKit, text: str) -> None:
    runs: list[int] = []

    @kit.defer.job("render", max_attempts=3)
    def render(job: Job) -> dict[str, str]:
        runs.append(job.attempts)
        return {"html": text}

    job = kit.defer.schedule("render")
    kit.db.session.commit()
    summary = kit.defer.run_due(now=later())
    assert summary.failed == 1 and summary.lost == 0
    stored = settle(kit, job)
    assert runs == [1]  # never a second run, never a lease lapse
    assert stored.status is JobStatus.FAILED
    assert "result cannot be stored" in (stored.last_error or "")
    assert "lease lapsed" not in (stored.last_error or "")


def test_an_error_message_with_a_nul_is_recorded(kit: AppKit) -> None:
    @kit.defer.job("boom", max_attempts=1)
    def boom(job: Job) -> None:
        raise RuntimeError("bad byte \x00 and \udc80 in the message")

    job = kit.defer.schedule("boom")
    kit.db.session.commit()
    assert kit.defer.run_due(now=later()).failed == 1
    stored = kit.defer.get(job.id)
    assert stored is not None and stored.status is JobStatus.FAILED
    assert "bad byte" in (stored.last_error or "")


class Stop(BaseException):
    """A custom BaseException, as some libraries raise for cancellation."""


@pytest.mark.parametrize("error", [SystemExit(3), GeneratorExit(), Stop("halt")])
def test_base_exceptions_are_recorded_as_the_attempts_failure(
    kit: AppKit, error: BaseException
) -> None:
    runs: list[int] = []

    @kit.defer.job("exits", max_attempts=2)
    def exits(job: Job) -> None:
        runs.append(job.attempts)
        raise error

    job = kit.defer.schedule("exits")
    kit.db.session.commit()
    # In a worker thread (as the worker runs handlers), the error is recorded and
    # the run goes on; only the main thread re-raises SystemExit/KeyboardInterrupt.
    outcome: list[Any] = []
    app = kit.app

    def run() -> None:
        with app.app_context():
            outcome.append(kit.defer.run_due(now=later()))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert outcome and outcome[0].retried == 1
    stored = kit.defer.get(job.id)
    assert stored is not None and stored.status is JobStatus.PENDING and stored.attempts == 1
    assert type(error).__name__ in (stored.last_error or "")
    assert "Traceback" in (stored.last_error or "")


def test_keyboard_interrupt_in_run_due_is_recorded_then_re_raised(kit: AppKit) -> None:
    @kit.defer.job("interrupted", max_attempts=3)
    def interrupted(job: Job) -> None:
        raise KeyboardInterrupt

    job = kit.defer.schedule("interrupted")
    kit.db.session.commit()
    with pytest.raises(KeyboardInterrupt):
        kit.defer.run_due(now=later())
    stored = kit.defer.get(job.id)
    assert stored is not None and stored.status is JobStatus.PENDING
    assert "KeyboardInterrupt" in (stored.last_error or "")


def notes_model(kit: AppKit) -> Any:
    class Note(kit.db.Model):  # type: ignore[name-defined, misc]
        __tablename__ = "notes"
        id: Mapped[int] = mapped_column(primary_key=True)
        text: Mapped[str] = mapped_column(String(50))

    return Note


def test_an_atomic_handler_that_commits_fails_once_and_commits_nothing(make_app: Any) -> None:
    kit: AppKit = make_app()
    note = notes_model(kit)
    runs: list[int] = []

    @kit.defer.job("write", atomic=True, max_attempts=3)
    def write(job: Job) -> None:
        runs.append(job.attempts)
        kit.db.session.add(note(text="effect"))
        kit.db.session.commit()

    with kit.app.app_context():
        kit.db.create_all()
        job = kit.defer.schedule("write")
        kit.db.session.commit()
        stored = settle(kit, job)
        assert runs == [1]
        assert stored.status is JobStatus.FAILED
        assert "atomic handlers must not commit" in (stored.last_error or "")
        assert kit.db.session.execute(select(note)).all() == []


def test_an_atomic_handler_that_swallows_the_refused_commit_still_fails(make_app: Any) -> None:
    kit: AppKit = make_app()
    note = notes_model(kit)

    @kit.defer.job("write", atomic=True, max_attempts=3)
    def write(job: Job) -> None:
        kit.db.session.add(note(text="effect"))
        try:
            kit.db.session.commit()
        except Exception:  # noqa: BLE001 - the careless author this test is about
            pass

    with kit.app.app_context():
        kit.db.create_all()
        job = kit.defer.schedule("write")
        kit.db.session.commit()
        stored = settle(kit, job)
        assert stored.status is JobStatus.FAILED and stored.attempts == 1
        assert "atomic handlers must not commit" in (stored.last_error or "")
        assert kit.db.session.execute(select(note)).all() == []


def test_a_handler_leaving_scheduled_jobs_uncommitted_is_warned_about(
    kit: AppKit, caplog: pytest.LogCaptureFixture
) -> None:
    @kit.defer.job("follow_up")
    def follow_up(job: Job) -> None:
        pass

    @kit.defer.job("careless")
    def careless(job: Job) -> None:
        kit.defer.schedule("follow_up")  # never committed

    @kit.defer.job("careful")
    def careful(job: Job) -> None:
        kit.defer.schedule("follow_up", key="kept")
        kit.db.session.commit()

    careless_job = kit.defer.schedule("careless")
    careful_job = kit.defer.schedule("careful")
    kit.db.session.commit()
    with caplog.at_level(logging.WARNING, logger="flask_defer"):
        kit.defer.run_due(now=later())
    stored = kit.defer.get(careless_job.id)
    assert stored is not None and stored.status is JobStatus.DONE
    assert "without committing" in (stored.last_error or "")
    assert any("without committing" in r.getMessage() for r in caplog.records)
    kept = kit.defer.get(careful_job.id)
    assert kept is not None and kept.status is JobStatus.DONE and kept.last_error is None
    assert kit.defer.get(key="kept") is not None
    assert [j.name for j in kit.defer.list(name="follow_up")] == ["follow_up"]


def test_an_atomic_handler_holding_the_sqlite_lock_past_the_busy_timeout_warns(
    make_app: Any, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    kit: AppKit = make_app(DEFER_SQLITE_BUSY_TIMEOUT=timedelta(milliseconds=100))
    note = notes_model(kit)

    @kit.defer.job("slow_write", atomic=True)
    def slow_write(job: Job) -> None:
        kit.db.session.add(note(text=job.payload["text"]))
        kit.db.session.flush()  # takes SQLite's write lock
        time.sleep(job.payload["sleep"])

    with kit.app.app_context():
        kit.db.create_all()
        kit.defer.schedule("slow_write", {"text": "quick", "sleep": 0})
        kit.db.session.commit()
        with caplog.at_level(logging.WARNING, logger="flask_defer"):
            kit.defer.run_due(now=later())
        assert not any("write lock" in r.getMessage() for r in caplog.records)
        kit.defer.schedule("slow_write", {"text": "slow", "sleep": 0.3})
        kit.db.session.commit()
        with caplog.at_level(logging.WARNING, logger="flask_defer"):
            kit.defer.run_due(now=later())
    warned = [r for r in caplog.records if "write lock" in r.getMessage()]
    # PostgreSQL locks rows, not the database: nothing to warn about there.
    assert len(warned) == (1 if backend == "sqlite" else 0)
    if warned:
        assert "DEFER_SQLITE_BUSY_TIMEOUT" in warned[0].getMessage()


@pytest.mark.parametrize("atomic", [False, True])
def test_a_successful_job_logs_only_debug_lines_with_attempt_and_run_time(
    kit: AppKit, caplog: pytest.LogCaptureFixture, atomic: bool
) -> None:
    @kit.defer.job("brief", atomic=atomic, max_attempts=4)
    def brief(job: Job) -> None:
        time.sleep(0.02)

    job = kit.defer.schedule("brief")
    kit.db.session.commit()
    with caplog.at_level(logging.DEBUG, logger="flask_defer"):
        kit.defer.run_due(now=later())
    mine = [r for r in caplog.records if r.getMessage().startswith(f"job {job.id} ")]
    lines = [(r.levelno, r.getMessage()) for r in mine]
    # Per-job success lines are DEBUG: at INFO a busy worker logs a summary instead.
    assert [level for level, _ in lines] == [logging.DEBUG, logging.DEBUG]
    assert lines[0][1] == f"job {job.id} brief: started (attempt 1 of 4)"
    done = re.fullmatch(rf"job {job.id} brief: done in (\d+) ms \(attempt 1 of 4\)", lines[1][1])
    assert done is not None and 20 <= int(done.group(1)) < 5000


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (KeyError("message_id"), "KeyError: 'message_id'"),
        (RuntimeError(""), "RuntimeError"),
        (ValueError("first line\nsecond line"), "ValueError: first line …"),
        (OSError("x" * 5000), "OSError: " + "x" * 199 + "…"),
    ],
)
def test_a_failure_log_line_names_the_error_type_and_stays_short(
    error: BaseException, expected: str
) -> None:
    assert error_summary(error) == expected


def test_a_failed_attempt_logs_the_exception_type(
    kit: AppKit, caplog: pytest.LogCaptureFixture
) -> None:
    @kit.defer.job("lookup", max_attempts=2)
    def lookup(job: Job) -> None:
        raise KeyError("message_id")

    kit.defer.schedule("lookup")
    kit.db.session.commit()
    with caplog.at_level(logging.WARNING, logger="flask_defer"):
        kit.defer.run_due(now=later())
    failed = [r.getMessage() for r in caplog.records if "attempt 1 failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].endswith(": KeyError: 'message_id'")


def test_retry_after_is_held_to_the_retry_cap(make_app: Any) -> None:
    kit = make_app(DEFER_RETRY_CAP=timedelta(minutes=5))

    @kit.defer.job("poll")
    def poll(job: Job) -> None:
        raise RetryAfter(timedelta(days=2), "come back the day after tomorrow")

    with kit.app.app_context():
        kit.db.create_all()
        job = kit.defer.schedule("poll")
        kit.db.session.commit()
        now = datetime.now(UTC)
        kit.defer.run_due(now=now)
        retried = kit.defer.get(job.id)
    assert retried is not None and retried.status is JobStatus.PENDING
    # At the cap: not the two days asked for, nor the usual backoff, nor "now".
    cap = now + timedelta(minutes=5)
    assert cap - timedelta(seconds=1) <= retried.run_at <= cap + timedelta(seconds=1)
