"""Recurring schedules through the facade and run_due(now=...), on both backends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import update

from flask_defer import InvalidArgument, Job, NotConfigured, ScheduleNotFound, UnknownJob
from flask_defer.engine.ticks import TickTimer
from flask_defer.timeutil import utcnow

from ..conftest import AppKit


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def record_runs(kit: AppKit, name: str = "tick") -> list[Job]:
    ran: list[Job] = []

    @kit.defer.job(name)
    def handler(job: Job) -> None:
        ran.append(job)

    return ran


def tick_keys(kit: AppKit, schedule_id: str) -> list[str]:
    jobs = kit.defer.list(key_prefix=f"recurring:{schedule_id}:", limit=10_000)
    return sorted(job.key or "" for job in jobs)


def test_monday_0900_berlin_is_0800_utc_before_the_march_change_and_0700_after(
    kit: AppKit,
) -> None:
    ran = record_runs(kit, "send_digest")
    kit.defer.recurring("weekly-digest", "send_digest", cron="0 9 * * MON", tz="Europe/Berlin")
    kit.defer.run_due(now=utc(2026, 3, 20, 12))  # Friday: first sync, nothing due
    assert ran == []
    (row,) = kit.defer.list_recurring()
    assert row.next_run_at == utc(2026, 3, 23, 8)  # CET, UTC+1
    kit.defer.run_due(now=utc(2026, 3, 23, 7, 59, 59))
    assert ran == []
    kit.defer.run_due(now=utc(2026, 3, 23, 8))
    kit.defer.run_due(now=utc(2026, 3, 23, 8, 0, 30))  # again: no second job
    assert [job.key for job in ran] == ["recurring:weekly-digest:2026-03-23T08:00:00Z"]
    # The clocks went forward on 29 March: 09:00 CEST is 07:00 UTC.
    kit.defer.run_due(now=utc(2026, 3, 30, 6, 59))
    assert len(ran) == 1
    kit.defer.run_due(now=utc(2026, 3, 30, 7))
    kit.defer.run_due(now=utc(2026, 3, 30, 7, 0, 10))
    assert [job.key for job in ran][1:] == ["recurring:weekly-digest:2026-03-30T07:00:00Z"]
    (row,) = kit.defer.list_recurring()
    assert row.last_run_at == utc(2026, 3, 30, 7)
    assert row.next_run_at == utc(2026, 4, 6, 7)


def run_every_quarter_hour(kit: AppKit, start: datetime, end: datetime) -> None:
    moment = start
    while moment <= end:
        kit.defer.run_due(now=moment)
        moment += timedelta(minutes=15)


def test_new_york_spring_forward_runs_the_missing_0230_once_at_0300_local(kit: AppKit) -> None:
    ran = record_runs(kit)
    kit.defer.recurring("nightly", "tick", cron="30 2 * * *", tz="America/New_York")
    # 8 March 2026: 02:00 EST jumps to 03:00 EDT, so 02:30 never happens.
    run_every_quarter_hour(kit, utc(2026, 3, 7, 6), utc(2026, 3, 9, 8))
    assert [job.run_at for job in ran] == [
        utc(2026, 3, 7, 7, 30),  # 02:30 EST
        utc(2026, 3, 8, 7, 0),  # the next valid instant: 03:00 EDT
        utc(2026, 3, 9, 6, 30),  # 02:30 EDT
    ]


def test_new_york_fall_back_runs_the_repeated_0130_once(kit: AppKit) -> None:
    ran = record_runs(kit)
    kit.defer.recurring("nightly", "tick", cron="30 1 * * *", tz="America/New_York")
    # 1 November 2026: 02:00 EDT falls back to 01:00 EST, so 01:30 happens twice.
    run_every_quarter_hour(kit, utc(2026, 10, 31, 5), utc(2026, 11, 2, 7))
    assert [job.run_at for job in ran] == [
        utc(2026, 10, 31, 5, 30),  # 01:30 EDT
        utc(2026, 11, 1, 5, 30),  # the first 01:30 (EDT) only
        utc(2026, 11, 2, 6, 30),  # 01:30 EST
    ]


@pytest.mark.parametrize(
    ("catch_up", "expected"),
    [
        ("latest", ["2026-03-04T09:00:00Z"]),
        ("skip", []),
        (
            "all",
            [f"2026-03-{d:02d}T{h:02d}:00:00Z" for d in (1, 2, 3, 4) for h in range(24)][10:82],
        ),
    ],
)
def test_catch_up_policies_after_a_three_day_outage(
    kit: AppKit, catch_up: str, expected: list[str]
) -> None:
    ran = record_runs(kit)
    kit.defer.recurring("hourly", "tick", cron="0 * * * *", catch_up=catch_up)  # type: ignore[arg-type]
    kit.defer.run_due(now=utc(2026, 3, 1, 9, 30))  # synced: next tick 10:00
    kit.defer.run_due(now=utc(2026, 3, 4, 9, 30))  # three days later, 72 ticks missed
    assert [job.key.removeprefix("recurring:hourly:") for job in ran if job.key] == expected
    (row,) = kit.defer.list_recurring()
    assert row.next_run_at == utc(2026, 3, 4, 10)
    kit.defer.run_due(now=utc(2026, 3, 4, 10))  # and on time again
    assert ran[-1].key == "recurring:hourly:2026-03-04T10:00:00Z"


def test_catch_up_all_is_bounded_by_max_catch_up(make_app: Any) -> None:
    kit = make_app(DEFER_RECURRING_MAX_CATCH_UP=5)
    with kit.app.app_context():
        kit.db.create_all()
        ran = record_runs(kit)
        kit.defer.recurring("hourly", "tick", cron="0 * * * *", catch_up="all")
        kit.defer.run_due(now=utc(2026, 3, 1, 9, 30))
        kit.defer.run_due(now=utc(2026, 3, 4, 9, 30))
        assert [job.run_at for job in ran] == [utc(2026, 3, 4, h) for h in range(5, 10)]


def test_pause_writes_no_ticks_and_resume_runs_only_the_next_tick(kit: AppKit) -> None:
    ran = record_runs(kit)
    kit.defer.recurring("hourly", "tick", cron="0 * * * *", catch_up="all")
    kit.defer.run_due(now=utc(2026, 3, 1, 10))
    assert len(ran) == 1
    assert kit.defer.pause_recurring("hourly") is True
    assert kit.defer.pause_recurring("hourly") is False  # already paused
    for hour in range(11, 16):
        kit.defer.run_due(now=utc(2026, 3, 1, hour))
    assert len(ran) == 1
    assert kit.defer.list_recurring()[0].paused
    assert kit.defer.resume_recurring("hourly", now=utc(2026, 3, 1, 15, 30)) is True
    assert kit.defer.resume_recurring("hourly", now=utc(2026, 3, 1, 15, 30)) is False
    kit.defer.run_due(now=utc(2026, 3, 1, 15, 45))
    assert len(ran) == 1  # no burst of the paused hours, even with catch_up="all"
    kit.defer.run_due(now=utc(2026, 3, 1, 16))
    assert [job.run_at for job in ran] == [utc(2026, 3, 1, 10), utc(2026, 3, 1, 16)]


def test_old_code_run_due_beside_a_new_code_worker_writes_every_tick_exactly_once(
    make_app: Any,
) -> None:
    """A rolling deploy: the new release declares ``beat``, the old one ``legacy``.

    The new release's worker syncs once at its start and then writes due ticks; the old
    release's ``run_due`` (a cron job still deployed) syncs at every call and runs
    whatever is due. Neither stops the other's schedule: over 40 one-second ticks each
    schedule's tick is written exactly once, by the release that declares it, and
    every tick job runs once.
    """
    new, old = make_app(), make_app()
    t0 = utc(2026, 3, 1, 10)
    with new.app.app_context():
        new.db.create_all()
    ran = record_runs(new)
    ran_old = record_runs(old)  # the old release knows the handler too
    new.defer.recurring("beat", "tick", every=1, catch_up="all")
    old.defer.recurring("legacy", "tick", every=1, catch_up="all")
    with old.app.app_context():
        old.defer.run_due(now=t0 - timedelta(milliseconds=500))  # the old release runs
    with new.app.app_context():
        ticker = new.app.extensions["defer"].recurring
        timer = TickTimer(ticker, poll_interval=0.0)
        timer.sync(t0 - timedelta(milliseconds=400))  # the new worker starts
    for second in range(40):
        at = t0 + timedelta(seconds=second)
        with new.app.app_context():
            timer.write_due(at)
            new.defer.run_due(now=at + timedelta(milliseconds=100))
        with old.app.app_context():
            old.defer.run_due(now=at + timedelta(milliseconds=500))
    with new.app.app_context():
        expected = [f"2026-03-01T10:00:{s:02d}Z" for s in range(40)]
        assert tick_keys(new, "beat") == [f"recurring:beat:{e}" for e in expected]
        assert tick_keys(new, "legacy") == [f"recurring:legacy:{e}" for e in expected]
        rows = {row.id: row for row in new.defer.list_recurring()}
        assert not rows["beat"].orphaned and not rows["legacy"].orphaned
    keys = [job.key for job in ran + ran_old]
    assert len(keys) == len(set(keys)) == 80  # every tick job ran, none twice


def test_a_schedule_gone_from_the_code_is_left_alone_then_orphaned_after_the_grace(
    make_app: Any,
) -> None:
    first = make_app()
    with first.app.app_context():
        first.db.create_all()
        record_runs(first)
        first.defer.recurring("hourly", "tick", cron="0 * * * *")
        first.defer.run_due(now=utc(2026, 3, 1, 10))
    # The next release no longer declares it (DEFER_SCHEDULE_ORPHAN_GRACE: 24 h).
    second = make_app()
    with second.app.app_context():
        ran = record_runs(second)
        second.defer.run_due(now=utc(2026, 3, 1, 10, 5))
        assert second.defer.health(now=utc(2026, 3, 1, 10, 5)).undeclared_schedules == ()
        second.defer.run_due(now=utc(2026, 3, 2, 9, 59))
        (row,) = second.defer.list_recurring()
        assert not row.orphaned and row.next_run_at == utc(2026, 3, 1, 11)  # untouched
        assert ran == []  # only code that declares a schedule writes its ticks
        health = second.defer.health(now=utc(2026, 3, 2, 9, 59))
        assert health.undeclared_schedules == ("hourly",)
        assert health.as_dict()["undeclared_schedules"] == ["hourly"]
        second.defer.run_due(now=utc(2026, 3, 2, 10, 0, 1))  # 24 h since its declaration
        (row,) = second.defer.list_recurring()
        assert row.orphaned and not row.paused
        assert second.defer.health(now=utc(2026, 3, 2, 10, 1)).undeclared_schedules == ()
        assert tick_keys(second, "hourly") == ["recurring:hourly:2026-03-01T10:00:00Z"]
    # Declared again: it restarts from its next tick, without the orphaned hours.
    third = make_app()
    with third.app.app_context():
        ran = record_runs(third)
        third.defer.recurring("hourly", "tick", cron="0 * * * *", catch_up="all")
        third.defer.run_due(now=utc(2026, 3, 2, 15, 30))
        assert ran == []
        (row,) = third.defer.list_recurring()
        assert not row.orphaned and row.next_run_at == utc(2026, 3, 2, 16)


def test_the_orphan_grace_period_is_a_setting(make_app: Any) -> None:
    first = make_app()
    with first.app.app_context():
        first.db.create_all()
        record_runs(first)
        first.defer.recurring("hourly", "tick", cron="0 * * * *")
        first.defer.run_due(now=utc(2026, 3, 1, 10))
    second = make_app(DEFER_SCHEDULE_ORPHAN_GRACE=timedelta(minutes=5))
    with second.app.app_context():
        second.defer.run_due(now=utc(2026, 3, 1, 10, 4))
        assert not second.defer.list_recurring()[0].orphaned
        # Health's "lately" is the grace period when that is shorter than ten minutes.
        assert second.defer.health(now=utc(2026, 3, 1, 10, 6)).undeclared_schedules == (
            "hourly",
        )
        second.defer.run_due(now=utc(2026, 3, 1, 10, 6))
        assert second.defer.list_recurring()[0].orphaned
    for bad in (-1, "1h", None):
        with pytest.raises(InvalidArgument, match="DEFER_SCHEDULE_ORPHAN_GRACE"):
            make_app(DEFER_SCHEDULE_ORPHAN_GRACE=bad)


def test_forget_recurring_orphans_an_undeclared_schedule_now(make_app: Any) -> None:
    # Real time: the facade's calls sync at the current time.
    first = make_app()
    with first.app.app_context():
        first.db.create_all()
        record_runs(first)
        first.defer.recurring("hourly", "tick", cron="0 * * * *")
        first.defer.recurring("daily", "tick", cron="0 9 * * *")
        first.defer.run_due()
    second = make_app()
    with second.app.app_context():
        ran = record_runs(second)
        second.defer.recurring("daily", "tick", cron="0 9 * * *")
        with pytest.raises(InvalidArgument, match="declared by this code"):
            second.defer.forget_recurring("daily")
        with pytest.raises(ScheduleNotFound):
            second.defer.forget_recurring("nope")
        with pytest.raises(InvalidArgument, match="id"):
            second.defer.forget_recurring("")
        assert second.defer.forget_recurring("hourly") is True
        assert second.defer.forget_recurring("hourly") is False
        rows = {row.id: row for row in second.defer.list_recurring()}
        assert rows["hourly"].orphaned and not rows["daily"].orphaned
    # Even the release that still declares it no longer ticks it, until it restarts.
    with first.app.app_context():
        ticker = first.app.extensions["defer"].recurring
        later = rows["hourly"].next_run_at + timedelta(days=1)
        written = {job.key.split(":")[1] for job in ticker.materialise(later) if job.key}
        assert written == {"daily"}
    assert ran == []


def test_interval_ticks_at_whole_multiples_of_the_interval(kit: AppKit) -> None:
    ran = record_runs(kit)
    kit.defer.recurring("five", "tick", every=timedelta(minutes=5), payload={"x": 1})
    kit.defer.run_due(now=utc(2026, 3, 1, 10, 2))
    (row,) = kit.defer.list_recurring()
    assert row.next_run_at == utc(2026, 3, 1, 10, 5)
    assert row.every == timedelta(minutes=5) and row.cron is None and row.tz == "UTC"
    kit.defer.run_due(now=utc(2026, 3, 1, 10, 5, 1))
    kit.defer.run_due(now=utc(2026, 3, 1, 10, 10, 30))
    assert [job.run_at for job in ran] == [utc(2026, 3, 1, 10, 5), utc(2026, 3, 1, 10, 10)]
    assert ran[0].payload == {"x": 1}


def test_changing_the_rule_in_code_restarts_the_schedule_from_now(make_app: Any) -> None:
    first = make_app()
    with first.app.app_context():
        first.db.create_all()
        record_runs(first)
        first.defer.recurring("report", "tick", cron="0 9 * * *")
        first.defer.run_due(now=utc(2026, 3, 1, 8))
    second = make_app()
    with second.app.app_context():
        record_runs(second)
        second.defer.recurring("report", "tick", cron="0 18 * * *")
        second.defer.run_due(now=utc(2026, 3, 1, 8, 30))
        (row,) = second.defer.list_recurring()
        assert row.cron == "0 18 * * *" and row.next_run_at == utc(2026, 3, 1, 18)


def test_a_late_schedule_counts_as_backlog_in_health(kit: AppKit) -> None:
    record_runs(kit)
    kit.defer.recurring("hourly", "tick", cron="0 * * * *")
    kit.defer.run_due(now=utc(2026, 3, 1, 9, 30))
    on_time = kit.defer.health(now=utc(2026, 3, 1, 10, 0, 30))
    assert on_time.late_schedules == 0 and on_time.owed == 0
    late = kit.defer.health(now=utc(2026, 3, 1, 10, 5))
    assert late.late_schedules == 1 and late.owed == 1
    assert late.oldest_owed_age == 300
    kit.defer.pause_recurring("hourly")
    assert kit.defer.health(now=utc(2026, 3, 1, 10, 5)).late_schedules == 0


def test_a_tick_is_an_ordinary_job_that_can_be_cancelled(kit: AppKit) -> None:
    ran = record_runs(kit)
    kit.defer.recurring("hourly", "tick", cron="0 * * * *")
    kit.defer.run_due(now=utc(2026, 3, 1, 9, 30))
    kit.defer.store  # noqa: B018 - the store is the app's
    # The worker materialises the tick at 10:00; cancelling it then stops that run only.
    state = kit.app.extensions["defer"]
    assert state.recurring is not None
    (job,) = state.recurring.materialise(utc(2026, 3, 1, 10))
    assert kit.defer.cancel(key="recurring:hourly:2026-03-01T10:00:00Z") is True
    kit.defer.run_due(now=utc(2026, 3, 1, 10, 0, 5))
    assert ran == []
    kit.defer.run_due(now=utc(2026, 3, 1, 11))
    assert [j.key for j in ran] == ["recurring:hourly:2026-03-01T11:00:00Z"]
    assert job.name == "tick"


def test_run_recurring_now_writes_one_extra_job_and_leaves_the_ticks(kit: AppKit) -> None:
    ran = record_runs(kit)
    kit.defer.recurring("hourly", "tick", cron="0 * * * *")
    kit.defer.list_recurring()
    job = kit.defer.run_recurring_now("hourly")
    assert job.key is not None and job.key.startswith("recurring:hourly:")
    assert job.key.endswith(":now")
    kit.defer.run_due()
    assert [j.id for j in ran] == [job.id]
    with pytest.raises(ScheduleNotFound):
        kit.defer.run_recurring_now("nope")
    with pytest.raises(ScheduleNotFound):
        kit.defer.pause_recurring("nope")


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "0 9 * *"}, "cron"),
        ({"cron": 5}, "cron"),
        ({"cron": "0 9 * * *", "tz": "Europe/Nowhere"}, "tz"),
        ({"cron": "0 9 * * *", "every": 60}, "cron"),
        ({}, "cron"),
        ({"every": 0}, "every"),
        ({"every": timedelta(seconds=-5)}, "every"),
        ({"every": "5m"}, "every"),
        ({"every": 60, "catch_up": "some"}, "catch_up"),
        ({"every": 60, "payload": {"x": object()}}, "payload"),
    ],
)
def test_recurring_refuses_bad_arguments_naming_them(
    kit: AppKit, kwargs: dict[str, Any], argument: str
) -> None:
    record_runs(kit)
    with pytest.raises(InvalidArgument) as raised:
        kit.defer.recurring("s", "tick", **kwargs)
    assert raised.value.argument == argument


def test_recurring_refuses_a_bad_id_and_an_unregistered_job_at_declaration(kit: AppKit) -> None:
    record_runs(kit)
    for bad in ("", "has space", "a/b", 7):
        with pytest.raises(InvalidArgument) as raised:
            kit.defer.recurring(bad, "tick", every=60)  # type: ignore[arg-type]
        assert raised.value.argument == "id"
    with pytest.raises(UnknownJob):
        kit.defer.recurring("s", "not_registered", every=60)
    kit.defer.recurring("s", "tick", every=60)
    kit.defer.recurring("s", "tick", every=60)  # the same declaration again is fine
    with pytest.raises(InvalidArgument) as raised:
        kit.defer.recurring("s", "tick", every=120)
    assert raised.value.argument == "id"


def test_max_catch_up_must_be_a_positive_integer(make_app: Any) -> None:
    for bad in (0, -1, "5", 2.5, True):
        with pytest.raises(InvalidArgument) as raised:
            make_app(DEFER_RECURRING_MAX_CATCH_UP=bad)
        assert raised.value.argument == "DEFER_RECURRING_MAX_CATCH_UP"


def test_pausing_with_uncommitted_jobs_in_the_session_says_commit_first(kit: AppKit) -> None:
    record_runs(kit)
    kit.defer.recurring("hourly", "tick", cron="0 * * * *")
    kit.defer.list_recurring()
    kit.defer.schedule("tick")
    with pytest.raises(NotConfigured, match="commit"):
        kit.defer.pause_recurring("hourly")
    kit.db.session.commit()
    assert kit.defer.pause_recurring("hourly") is True


def test_a_broken_schedule_row_is_logged_and_skipped_while_the_others_tick(
    kit: AppKit, caplog: pytest.LogCaptureFixture
) -> None:
    ran = record_runs(kit)
    kit.defer.recurring("good", "tick", cron="0 * * * *")
    kit.defer.recurring("bad", "tick", cron="0 * * * *")
    kit.defer.run_due(now=utc(2026, 3, 1, 9, 30))
    ticker = kit.app.extensions["defer"].recurring
    with ticker.store.engine.begin() as conn:  # say, a zone this system's tzdata lacks
        conn.execute(
            update(ticker.store.table)
            .where(ticker.store.table.c.id == "bad")
            .values(tz="Nowhere/Gone")
        )
    kit.db.session.commit()
    written = ticker.materialise(utc(2026, 3, 1, 10))
    assert [job.key for job in written] == ["recurring:good:2026-03-01T10:00:00Z"]
    assert "recurring schedule 'bad': could not write its tick" in caplog.text
    kit.defer.run_due(now=utc(2026, 3, 1, 10, 0, 1))
    assert [job.key for job in ran] == ["recurring:good:2026-03-01T10:00:00Z"]


def test_a_tick_cut_off_by_a_killed_worker_runs_again_as_the_same_job(kit: AppKit) -> None:
    """Exactly one job per tick; the job itself is at least once (README, issue 28).

    A worker that claimed the tick's job and died (its lease lapsed) leaves the job to
    run again: the handler starts twice for that tick, with the same key, and the
    schedule writes no second job for it.
    """
    ran = record_runs(kit)
    kit.defer.recurring("beat", "tick", every=60)
    kit.defer.list_recurring()
    ticker = kit.app.extensions["defer"].recurring
    (row,) = kit.defer.list_recurring()
    (job,) = ticker.materialise(row.next_run_at)
    store = kit.app.extensions["defer"].store
    (claimed,) = store.claim(  # its lease, judged by the wall clock, has lapsed
        now=job.run_at, limit=1, token="killed", lease_until=utcnow() - timedelta(seconds=1)
    )
    assert claimed.id == job.id and claimed.attempts == 1  # started, then the worker died
    kit.defer.run_due(now=row.next_run_at + timedelta(seconds=1))  # reclaimed, run again
    assert [(j.id, j.attempts) for j in ran] == [(job.id, 2)]
    assert ticker.materialise(row.next_run_at) == []
    assert tick_keys(kit, "beat") == [job.key]
