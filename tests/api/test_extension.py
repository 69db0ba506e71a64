"""The Defer facade inside a real Flask app, on SQLite and PostgreSQL."""

from __future__ import annotations

import inspect as pyinspect
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import get_type_hints

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import inspect, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from flask_defer import (
    Defer,
    DeferError,
    InvalidArgument,
    Job,
    JobExists,
    JobNotFound,
    JobNotPending,
    JobStatus,
    NotConfigured,
    NotYet,
    RetryAfter,
    UnknownJob,
    job_cancelled,
    job_scheduled,
)
from flask_defer.operations.reads import Filters
from flask_defer.operations.scheduling import OPTION_NAMES

from ..conftest import AppKit


@pytest.fixture
def ran(kit: AppKit) -> list[Job]:
    """Registers a few handlers on the kit and records the jobs they ran."""
    seen: list[Job] = []

    @kit.defer.job("send_email", max_attempts=3)
    def send_email(job: Job) -> None:
        seen.append(job)

    @kit.defer.job("flaky", max_attempts=3)
    def flaky(job: Job) -> None:
        seen.append(job)
        raise RuntimeError(f"smtp down (attempt {job.attempts})")

    @kit.defer.job("wait_for_confirmation")
    def wait(job: Job) -> None:
        seen.append(job)
        raise NotYet(timedelta(hours=2))

    @kit.defer.job("rate_limited", max_attempts=5)
    def rate_limited(job: Job) -> None:
        seen.append(job)
        raise RetryAfter(120)

    return seen


def at(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


# -- wiring -----------------------------------------------------------------------


def test_init_app_twice_is_an_instructive_error(kit: AppKit) -> None:
    with pytest.raises(RuntimeError, match="already registered"):
        kit.defer.init_app(kit.app, db=kit.db)


def test_init_app_before_db_init_app_says_what_to_do(database_url: str) -> None:
    class Model(DeclarativeBase):
        pass

    db = SQLAlchemy(model_class=Model)
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = database_url
    with pytest.raises(NotConfigured, match=r"db.init_app\(app\) before"):
        Defer(app, db=db)


def test_use_outside_app_context_or_before_init_app_is_refused() -> None:
    defer = Defer()
    with pytest.raises(NotConfigured, match="application context"):
        defer.get(1)
    app = Flask(__name__)
    with app.app_context(), pytest.raises(NotConfigured, match="forget defer.init_app"):
        defer.get(1)


def test_defaults_are_set_once_and_config_is_frozen(make_app: Callable[..., AppKit]) -> None:
    kit = make_app(DEFER_MAX_ATTEMPTS=9)
    assert kit.app.config["DEFER_UNDO_MARGIN"] == timedelta(seconds=1)
    with kit.context():
        config = kit.defer.config
        assert config.max_attempts == 9
        with pytest.raises(AttributeError):
            config.max_attempts = 1  # type: ignore[misc]


def test_bad_config_value_names_the_key(make_app: Callable[..., AppKit]) -> None:
    with pytest.raises(InvalidArgument, match="DEFER_LEASE"):
        make_app(DEFER_LEASE="soon")


def test_table_lives_in_the_apps_metadata(kit: AppKit) -> None:
    assert "defer_jobs" in kit.db.metadata.tables
    assert "defer_jobs" in inspect(kit.db.engine).get_table_names()


def test_sqlite_engine_uses_wal_and_a_busy_timeout(kit: AppKit, backend: str) -> None:
    if backend != "sqlite":
        assert kit.db.engine.dialect.name == "postgresql"
        return
    with kit.db.engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 10_000


def test_without_db_jobs_live_in_a_sqlite_file_in_the_instance_folder(tmp_path: Path) -> None:
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    defer = Defer(app)

    @defer.job("ping")
    def ping(job: Job) -> None:
        pass

    with app.app_context():
        job = defer.schedule("ping", {"n": 1})
        assert defer.get(job.id) == job  # committed at once: no session to join
        assert defer.run_due().done == 1
        defer.store.engine.dispose()
    assert (tmp_path / "instance" / "defer.sqlite3").exists()


def test_a_handler_name_cannot_be_registered_twice(kit: AppKit) -> None:
    @kit.defer.job("dup")
    def first(job: Job) -> None:
        pass

    with pytest.raises(InvalidArgument, match="already registered"):

        @kit.defer.job("dup")
        def second(job: Job) -> None:
            pass


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [({"max_attempts": 0}, "max_attempts"), ({"timeout": -1}, "timeout"), ({"queue": ""}, "queue")],
)
def test_bad_handler_options_name_the_argument(
    kit: AppKit, kwargs: dict[str, object], argument: str
) -> None:
    with pytest.raises(InvalidArgument) as raised:
        kit.defer.job("x", **kwargs)  # type: ignore[call-overload]
    assert raised.value.argument == argument


# -- scheduling -------------------------------------------------------------------


def test_schedule_commits_with_the_callers_transaction(kit: AppKit, ran: list[Job]) -> None:
    job = kit.defer.schedule("send_email", {"message_id": 7}, delay=5, key="message:7:send")
    kit.db.session.commit()
    stored = kit.defer.get(key="message:7:send")
    assert stored is not None and stored.id == job.id
    assert stored.payload == {"message_id": 7}
    assert stored.max_attempts == 3


def test_rollback_of_the_callers_transaction_removes_the_job(
    kit: AppKit, ran: list[Job]
) -> None:
    job = kit.defer.schedule("send_email", {"message_id": 7})
    kit.db.session.rollback()
    assert kit.defer.get(job.id) is None


def test_schedule_and_business_row_commit_or_roll_back_together(
    make_app: Callable[..., AppKit],
) -> None:
    kit = make_app()

    class Message(kit.db.Model):  # type: ignore[name-defined,misc]
        id: Mapped[int] = mapped_column(primary_key=True)
        body: Mapped[str]

    @kit.defer.job("deliver")
    def deliver(job: Job) -> None:
        pass

    with kit.context():
        kit.db.create_all()
        kit.db.session.add(Message(body="hi"))
        kit.defer.schedule("deliver", {"message": 1})
        kit.db.session.rollback()
        assert kit.db.session.query(Message).count() == 0
        assert kit.defer.list() == []
        kit.db.session.add(Message(body="hi"))
        kit.defer.schedule("deliver", {"message": 1})
        kit.db.session.commit()
        assert kit.db.session.query(Message).count() == 1
        assert len(kit.defer.list()) == 1


def test_naive_run_at_is_refused_naming_the_argument(kit: AppKit, ran: list[Job]) -> None:
    with pytest.raises(InvalidArgument, match="run_at: naive datetime") as raised:
        kit.defer.schedule("send_email", run_at=datetime(2030, 1, 1, 9, 0))
    assert raised.value.argument == "run_at"
    assert isinstance(raised.value, ValueError)
    kit.db.session.commit()
    assert kit.defer.list() == []


def test_past_run_at_is_clamped_to_now(kit: AppKit, ran: list[Job]) -> None:
    before = datetime.now(UTC)
    job = kit.defer.schedule("send_email", run_at=datetime(2001, 1, 1, tzinfo=UTC))
    assert before <= job.run_at <= datetime.now(UTC)


def test_run_at_in_another_zone_is_stored_in_utc(kit: AppKit, ran: list[Job]) -> None:
    from zoneinfo import ZoneInfo

    paris = datetime(2031, 3, 1, 9, 0, tzinfo=ZoneInfo("Europe/Paris"))
    job = kit.defer.schedule("send_email", run_at=paris)
    kit.db.session.commit()
    stored = kit.defer.get(job.id)
    assert stored is not None
    assert stored.run_at == paris and stored.run_at.utcoffset() == timedelta(0)


def test_unknown_job_name_is_refused_and_nothing_written(kit: AppKit) -> None:
    with pytest.raises(UnknownJob, match="@defer.job"):
        kit.defer.schedule("no_such_job")
    kit.db.session.commit()
    assert kit.defer.list() == []


@pytest.mark.parametrize(
    "payload", [{"when": datetime(2030, 1, 1)}, {"n": float("nan")}, {1, 2}, object()]
)
def test_unserialisable_payload_is_refused_before_anything_is_written(
    kit: AppKit, ran: list[Job], payload: object
) -> None:
    with pytest.raises(InvalidArgument, match="payload: must be JSON-serialisable"):
        kit.defer.schedule("send_email", payload)
    kit.db.session.commit()
    assert kit.defer.list() == []


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"key": 42}, "key"),
        ({"key": ""}, "key"),
        ({"key": "k" * 256}, "key"),
        ({"owner": 7}, "owner"),
        ({"delay": -5}, "delay"),
        ({"delay": "5"}, "delay"),
        ({"delay": 5, "run_at": datetime(2030, 1, 1, tzinfo=UTC)}, "run_at"),
        ({"replace": "yes"}, "replace"),
    ],
)
def test_bad_arguments_are_refused_naming_the_argument(
    kit: AppKit, ran: list[Job], kwargs: dict[str, object], argument: str
) -> None:
    with pytest.raises(InvalidArgument) as raised:
        kit.defer.schedule("send_email", **kwargs)  # type: ignore[arg-type]
    assert raised.value.argument == argument
    kit.db.session.commit()
    assert kit.defer.list() == []


def test_live_key_taken_raises_job_exists_and_replace_swaps(kit: AppKit, ran: list[Job]) -> None:
    first = kit.defer.schedule("send_email", {"v": 1}, delay=60, key="digest:9")
    kit.db.session.commit()
    with pytest.raises(JobExists) as raised:
        kit.defer.schedule("send_email", {"v": 2}, delay=60, key="digest:9")
    assert raised.value.existing_id == first.id
    kit.db.session.rollback()
    second = kit.defer.schedule("send_email", {"v": 2}, delay=60, key="digest:9", replace=True)
    kit.db.session.commit()
    assert kit.defer.get(first.id).status is JobStatus.CANCELLED  # type: ignore[union-attr]
    assert kit.defer.get(key="digest:9") == second


def test_key_is_reusable_once_the_holder_settled(kit: AppKit, ran: list[Job]) -> None:
    kit.defer.schedule("send_email", key="once")
    kit.db.session.commit()
    kit.defer.run_due()
    again = kit.defer.schedule("send_email", key="once")
    kit.db.session.commit()
    assert kit.defer.get(key="once") == again


def test_signals_announce_scheduling_and_cancelling(kit: AppKit, ran: list[Job]) -> None:
    heard: list[tuple[str, int]] = []
    with (
        job_scheduled.connected_to(lambda app, job: heard.append(("scheduled", job.id))),
        job_cancelled.connected_to(lambda app, job: heard.append(("cancelled", job.id))),
    ):
        job = kit.defer.schedule("send_email", delay=60)
        kit.db.session.commit()
        kit.defer.cancel(job.id)
    assert heard == [("scheduled", job.id), ("cancelled", job.id)]


def test_cancel_many_announces_each_job_it_cancelled_after_the_commit(
    kit: AppKit, ran: list[Job]
) -> None:
    heard: list[int] = []
    first = kit.defer.schedule("send_email", delay=60, key="booking:1:a")
    second = kit.defer.schedule("send_email", delay=60, key="booking:1:b")
    kept = kit.defer.schedule("send_email", delay=60, key="booking:2:a")
    operators = kit.defer.schedule("send_email", delay=60, key="booking:3:a")
    kit.db.session.commit()
    with job_cancelled.connected_to(lambda app, job: heard.append(job.id)):
        assert kit.defer.cancel_many(key_prefix="booking:2:", commit=False)["cancelled"] == 1
        kit.db.session.rollback()
        assert heard == []  # rolled back: never cancelled, never announced

        answer = kit.defer.cancel_many(key_prefix="booking:1:", commit=False)
        assert answer == {"cancelled": 2, "in_flight": 0}
        assert heard == []  # not real until the caller commits
        kit.db.session.commit()
        assert sorted(heard) == sorted([first.id, second.id])

        kit.defer.cancel_many(key_prefix="booking:3:", actor="ops")  # an operator's
        assert heard[-1] == operators.id
    assert kit.defer.get(kept.id).status is JobStatus.PENDING  # type: ignore[union-attr]
    assert len(heard) == 3


# -- control ----------------------------------------------------------------------


def test_cancel_pending_returns_true_once(kit: AppKit, ran: list[Job]) -> None:
    job = kit.defer.schedule("send_email", delay=60, key="message:1:send")
    kit.db.session.commit()
    assert kit.defer.cancel(key="message:1:send") is True
    assert kit.defer.cancel(job.id) is False
    assert kit.defer.get(job.id).status is JobStatus.CANCELLED  # type: ignore[union-attr]


def test_cancel_of_a_finished_job_returns_false(kit: AppKit, ran: list[Job]) -> None:
    job = kit.defer.schedule("send_email")
    kit.db.session.commit()
    kit.defer.run_due()
    assert kit.defer.cancel(job.id) is False
    assert kit.defer.get(job.id).status is JobStatus.DONE  # type: ignore[union-attr]


def test_cancel_of_a_running_job_returns_false(kit: AppKit) -> None:
    @kit.defer.job("slow")
    def slow(job: Job) -> None:
        # Inside the handler the job is running: the cancel must lose, honestly.
        assert kit.defer.cancel(job.id) is False

    job = kit.defer.schedule("slow")
    kit.db.session.commit()
    assert kit.defer.run_due().done == 1
    assert kit.defer.get(job.id).status is JobStatus.DONE  # type: ignore[union-attr]


def test_cancel_unknown_id_or_key_raises_job_not_found(kit: AppKit) -> None:
    with pytest.raises(JobNotFound):
        kit.defer.cancel(424242)
    with pytest.raises(JobNotFound):
        kit.defer.cancel(key="nobody")


def test_cancel_of_another_owners_job_is_not_found(kit: AppKit, ran: list[Job]) -> None:
    job = kit.defer.schedule("send_email", delay=60, owner="alice")
    kit.db.session.commit()
    with pytest.raises(JobNotFound):
        kit.defer.cancel(job.id, owner="mallory")
    assert kit.defer.cancel(job.id, owner="alice") is True


@pytest.mark.parametrize("kwargs", [{}, {"id": 1, "key": "k"}, {"id": "1"}, {"id": True}])
def test_cancel_needs_exactly_one_of_id_or_key(kit: AppKit, kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        kit.defer.cancel(**kwargs)  # type: ignore[arg-type]


def test_cancel_while_the_session_holds_uncommitted_jobs_says_commit_first(
    kit: AppKit, ran: list[Job]
) -> None:
    job = kit.defer.schedule("send_email", delay=60)
    with pytest.raises(NotConfigured, match=r"db.session.commit\(\) first"):
        kit.defer.cancel(job.id)
    kit.db.session.commit()
    assert kit.defer.cancel(job.id) is True


def test_retry_while_the_session_holds_uncommitted_jobs_says_commit_first(
    kit: AppKit, ran: list[Job]
) -> None:
    @kit.defer.job("broken", max_attempts=1)
    def broken(job: Job) -> None:
        raise RuntimeError("down")

    failed = kit.defer.schedule("broken")
    kit.db.session.commit()
    kit.defer.run_due()
    kit.defer.schedule("send_email", delay=60)  # not committed yet
    began = time.monotonic()
    with pytest.raises(NotConfigured, match=r"db.session.commit\(\) first"):
        kit.defer.retry(failed.id)
    assert time.monotonic() - began < 1
    kit.db.session.commit()  # the caller's own job; the refused retry wrote nothing
    job = kit.defer.get(failed.id)
    assert job is not None and job.status is JobStatus.FAILED and job.attempts == 1


def test_retry_of_a_job_that_is_not_failed_says_so(kit: AppKit, ran: list[Job]) -> None:
    job = kit.defer.schedule("send_email", delay=60)
    kit.db.session.commit()
    with pytest.raises(JobNotPending, match=f"job {job.id} is pending, not failed"):
        kit.defer.retry(job.id)


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_control_call_after_an_uncommitted_app_write_fails_at_once_saying_why(
    kit: AppKit, ran: list[Job]
) -> None:
    """On SQLite an uncommitted write of the app holds the database's one write lock: a
    call with a transaction of its own would wait for its own thread; it says so."""
    job = kit.defer.schedule("send_email", delay=60)
    kit.db.session.commit()
    kit.db.session.execute(text("CREATE TABLE IF NOT EXISTS notes (n INTEGER)"))
    kit.db.session.execute(text("INSERT INTO notes VALUES (1)"))  # not committed
    began = time.monotonic()
    with pytest.raises(OperationalError, match="commit=False"):
        kit.defer.cancel(job.id)
    assert time.monotonic() - began < 1  # not the 10 s busy timeout
    assert kit.defer.cancel(job.id, commit=False) is True  # joining it works
    kit.db.session.commit()
    cancelled = kit.defer.get(job.id)
    assert cancelled is not None and cancelled.status is JobStatus.CANCELLED


def test_cancel_many_reports_cancelled_and_in_flight(kit: AppKit) -> None:
    @kit.defer.job("remind")
    def remind(job: Job) -> None:
        if job.key == "booking:42:remind":
            found = kit.defer.cancel_many(key_prefix="booking:42:")
            remind.outcome = found  # type: ignore[attr-defined]

    kit.defer.schedule("remind", key="booking:42:remind")
    kit.defer.schedule("remind", key="booking:42:close", delay=timedelta(days=90))
    kit.defer.schedule("remind", key="booking:43:close", delay=timedelta(days=90))
    kit.db.session.commit()
    kit.defer.run_due()
    assert remind.outcome == {"cancelled": 1, "in_flight": 1}  # type: ignore[attr-defined]
    assert [j.key for j in kit.defer.list(status="pending")] == ["booking:43:close"]


def test_cancel_many_without_a_filter_is_refused(kit: AppKit) -> None:
    with pytest.raises(InvalidArgument, match="refusing to cancel every job"):
        kit.defer.cancel_many()


def test_reschedule_moves_a_pending_job(kit: AppKit, ran: list[Job]) -> None:
    kit.defer.schedule("send_email", delay=60, key="publish:3")
    kit.db.session.commit()
    when = at(3600)
    moved = kit.defer.reschedule(key="publish:3", run_at=when)
    assert moved.run_at == when
    assert kit.defer.run_due(now=at(120)).ran == 0
    assert kit.defer.run_due(now=at(3700)).done == 1


def test_reschedule_of_a_settled_job_raises_job_not_pending(kit: AppKit, ran: list[Job]) -> None:
    job = kit.defer.schedule("send_email")
    kit.db.session.commit()
    kit.defer.run_due()
    with pytest.raises(JobNotPending) as raised:
        kit.defer.reschedule(job.id, delay=60)
    assert raised.value.status == "done"
    with pytest.raises(JobNotFound):
        kit.defer.reschedule(99999, delay=60)
    with pytest.raises(InvalidArgument, match="run_at"):
        kit.defer.reschedule(job.id, run_at=datetime(2030, 1, 1))


def test_get_by_key_prefers_the_live_job(kit: AppKit, ran: list[Job]) -> None:
    old = kit.defer.schedule("send_email", key="k")
    kit.db.session.commit()
    kit.defer.run_due()
    assert kit.defer.get(key="k").id == old.id  # type: ignore[union-attr]
    new = kit.defer.schedule("send_email", key="k", delay=60)
    kit.db.session.commit()
    assert kit.defer.get(key="k").id == new.id  # type: ignore[union-attr]


def test_list_filters_and_validates(kit: AppKit, ran: list[Job]) -> None:
    kit.defer.schedule("send_email", key="a:1", owner="alice", delay=60)
    kit.defer.schedule("send_email", key="a:2", owner="bob", delay=60)
    kit.defer.schedule("flaky", key="b:1", delay=60)
    kit.db.session.commit()
    assert len(kit.defer.list(name="send_email")) == 2
    assert [j.key for j in kit.defer.list(key_prefix="a:", owner="bob")] == ["a:2"]
    assert len(kit.defer.list(status=["pending", JobStatus.DONE], limit=2)) == 2
    with pytest.raises(InvalidArgument, match="status"):
        kit.defer.list(status="sleeping")
    with pytest.raises(InvalidArgument, match="limit"):
        kit.defer.list(limit=0)


# -- run_due ----------------------------------------------------------------------


def test_run_due_honours_due_times(kit: AppKit, ran: list[Job]) -> None:
    kit.defer.schedule("send_email", {"n": 1})
    kit.defer.schedule("send_email", {"n": 2}, delay=60)
    kit.db.session.commit()
    assert kit.defer.run_due().done == 1
    assert [job.payload for job in ran] == [{"n": 1}]
    assert kit.defer.run_due(now=at(61)).done == 1
    assert [job.payload["n"] for job in ran] == [1, 2]
    assert ran[1].attempts == 1 and ran[1].status is JobStatus.RUNNING


def test_failures_back_off_then_fail_with_the_traceback(kit: AppKit, ran: list[Job]) -> None:
    job = kit.defer.schedule("flaky")
    kit.db.session.commit()
    now = datetime.now(UTC)
    assert kit.defer.run_due(now=now).retried == 1
    first = kit.defer.get(job.id)
    assert first is not None and first.status is JobStatus.PENDING
    # DEFER_RETRY_BASE is 10 s in the test app: the first retry waits 5..10 s.
    assert now + timedelta(seconds=5) <= first.run_at <= now + timedelta(seconds=10)
    assert kit.defer.run_due(now=now + timedelta(seconds=4)).ran == 0
    assert kit.defer.run_due(now=first.run_at).retried == 1
    second = kit.defer.get(job.id)
    assert second is not None
    assert first.run_at + timedelta(seconds=10) <= second.run_at <= first.run_at + timedelta(20)
    assert kit.defer.run_due(now=second.run_at).failed == 1
    dead = kit.defer.get(job.id)
    assert dead is not None and dead.status is JobStatus.FAILED and dead.attempts == 3
    assert "RuntimeError: smtp down (attempt 3)" in (dead.last_error or "")
    assert "Traceback" in (dead.last_error or "")
    assert dead.due_at == job.due_at


def test_not_yet_reschedules_without_spending_an_attempt(kit: AppKit, ran: list[Job]) -> None:
    job = kit.defer.schedule("wait_for_confirmation")
    kit.db.session.commit()
    for _ in range(4):
        assert kit.defer.run_due(now=at(10_000 * _)).snoozed == 1
    after = kit.defer.get(job.id)
    assert after is not None
    assert after.status is JobStatus.PENDING and after.attempts == 0
    assert after.run_at > datetime.now(UTC) + timedelta(hours=1)


def test_not_yet_refuses_naive_or_past_times() -> None:
    with pytest.raises(InvalidArgument, match="until"):
        NotYet(datetime(2030, 1, 1))
    with pytest.raises(InvalidArgument, match="not in the future"):
        NotYet(datetime(2001, 1, 1, tzinfo=UTC))
    with pytest.raises(InvalidArgument):
        NotYet(-5)


def test_retry_after_sets_the_delay_and_spends_an_attempt(kit: AppKit, ran: list[Job]) -> None:
    job = kit.defer.schedule("rate_limited")
    kit.db.session.commit()
    now = datetime.now(UTC)
    assert kit.defer.run_due(now=now).retried == 1
    after = kit.defer.get(job.id)
    assert after is not None
    assert after.run_at == now + timedelta(seconds=120) and after.attempts == 1


def test_unknown_handler_stays_pending_and_is_counted(kit: AppKit, ran: list[Job]) -> None:
    job = kit.defer.schedule("send_email")
    kit.db.session.commit()
    # A rolling deploy: this process no longer knows the handler.
    kit.defer.registry._specs.pop("send_email")
    assert kit.defer.run_due().unknown == 1
    after = kit.defer.get(job.id)
    assert after is not None and after.status is JobStatus.PENDING and after.attempts == 0
    assert "no handler" in (after.last_error or "")
    assert kit.defer.health().unknown_handlers == 1


def test_health_separates_scheduled_from_owed(kit: AppKit, ran: list[Job]) -> None:
    kit.defer.schedule("send_email", delay=timedelta(days=30))
    kit.defer.schedule("send_email")
    kit.db.session.commit()
    health = kit.defer.health(now=at(60))
    assert health.scheduled == 1 and health.owed == 1
    assert health.oldest_owed_age is not None and 55 <= health.oldest_owed_age <= 65


def test_every_error_is_a_defer_error() -> None:
    for error in (InvalidArgument, JobExists, JobNotFound, JobNotPending, UnknownJob):
        assert issubclass(error, DeferError)
    assert issubclass(NotConfigured, RuntimeError)


#: DESIGN §4's public names and the keyword parameters it fixes for them.
DESIGN_PARAMETERS: dict[str, set[str]] = {
    "init_app": {"app", "db"},
    "job": {"max_attempts", "timeout"},
    "schedule": {"payload", "run_at", "delay", "key", "replace", "owner", "label"},
    "cancel": {"id", "key"},
    "cancel_many": set(),
    "reschedule": {"key", "run_at", "delay"},
    "get": {"id", "key"},
    "list": {"limit"},
    "run_due": {"now"},
    "health": set(),
    "undoable": {"payload", "window", "label", "done_label", "failed_label"},
    "soft_delete": {"obj", "grace", "label"},
    "batch": {"key", "item", "window"},
    "recurring": {"id", "job_name", "cron", "every", "tz", "payload", "catch_up"},
    "pause_recurring": {"id"},
    "resume_recurring": {"id"},
    "list_recurring": set(),
    "history": {"job_id"},
}


def test_every_public_name_of_the_design_is_a_method_of_defer_with_its_parameters() -> None:
    for name, parameters in DESIGN_PARAMETERS.items():
        method = getattr(Defer, name)
        assert callable(method), name
        signature = pyinspect.signature(method).parameters
        accepted = set(signature)
        # Keywords relayed with Unpack: the scheduling options, or the job filters.
        hints = get_type_hints(method, include_extras=True)
        if "options" in hints:
            accepted |= OPTION_NAMES
        if "filters" in hints:
            accepted |= set(Filters.__annotations__)
        assert parameters <= accepted, (name, parameters - accepted)


def test_every_public_method_of_defer_says_what_it_does() -> None:
    # Inherited ones too: the facade's method groups live in flask_defer/facade/.
    undocumented = [
        name
        for name, member in pyinspect.getmembers(Defer)
        if not name.startswith("_") and callable(member) and not pyinspect.getdoc(member)
    ]
    assert undocumented == []

