"""The schedules store over a bare engine (no Flask), on SQLite and PostgreSQL.

The compare-and-set that makes a tick exactly-once is checked directly here: two
advances from the same read row, and many threads racing for one due tick.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, MetaData

from flask_defer.recurring_rules import RecurringSpec, make_rule, make_spec, tick_key
from flask_defer.store import JobStore, NewJob
from flask_defer.store.recurring_statements import ScheduleRow, ScheduleStore
from flask_defer.store.schema import define_jobs_table, define_schedules_table

T0 = datetime(2026, 3, 1, 10, tzinfo=UTC)
DAY = timedelta(days=1)


@pytest.fixture
def schedules(engine: Engine) -> ScheduleStore:
    metadata = MetaData()
    jobs = JobStore(engine, define_jobs_table(metadata))
    jobs.create_table()
    store = ScheduleStore(engine, define_schedules_table(metadata), jobs)
    store.create_table()
    return store


def hourly(schedule_id: str = "hourly", cron: str = "0 * * * *") -> RecurringSpec:
    return make_spec(schedule_id, "tick", make_rule(cron, None, "UTC"), {}, "latest")


def tick_job(row: ScheduleRow, tick: datetime) -> tuple[datetime, NewJob]:
    new = NewJob(
        name="tick", payload={}, run_at=tick, max_attempts=1, key=tick_key(row.id, tick)
    )
    return tick, new


def test_two_advances_from_the_same_read_write_the_tick_once(schedules: ScheduleStore) -> None:
    schedules.sync([hourly()], now=T0 - timedelta(minutes=30), orphan_grace=DAY)
    (row,) = schedules.due(now=T0, ids={"hourly"})
    first = schedules.advance(
        row, next_tick=T0 + timedelta(hours=1), ticks=[tick_job(row, T0)], now=T0
    )
    second = schedules.advance(
        row, next_tick=T0 + timedelta(hours=1), ticks=[tick_job(row, T0)], now=T0
    )
    assert first is not None and len(first) == 1
    assert second is None
    stored = schedules.get("hourly")
    assert stored is not None
    assert stored.next_run_at == T0 + timedelta(hours=1) and stored.last_run_at == T0
    assert schedules.due(now=T0, ids={"hourly"}) == []


def test_threads_racing_for_one_due_tick_write_exactly_one_job(
    schedules: ScheduleStore,
) -> None:
    schedules.sync([hourly()], now=T0 - timedelta(minutes=30), orphan_grace=DAY)
    (row,) = schedules.due(now=T0, ids={"hourly"})
    barrier = threading.Barrier(8)
    results: list[object] = []

    def race() -> None:
        barrier.wait()
        results.append(
            schedules.advance(
                row, next_tick=T0 + timedelta(hours=1), ticks=[tick_job(row, T0)], now=T0
            )
        )

    threads = [threading.Thread(target=race) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    winners = [r for r in results if r is not None]
    assert len(results) == 8 and len(winners) == 1


def test_a_paused_schedule_cannot_be_advanced_by_a_stale_read(schedules: ScheduleStore) -> None:
    schedules.sync([hourly()], now=T0 - timedelta(minutes=30), orphan_grace=DAY)
    (row,) = schedules.due(now=T0, ids={"hourly"})
    assert schedules.pause("hourly", now=T0)
    assert schedules.advance(row, next_tick=T0, ticks=[tick_job(row, T0)], now=T0) is None
    assert schedules.next_due({"hourly"}) is None  # paused: not a live schedule


def test_sync_adds_restarts_a_changed_rule_and_leaves_the_undeclared_alone(
    schedules: ScheduleStore,
) -> None:
    added = schedules.sync(
        [hourly("a"), hourly("b")], now=T0 - timedelta(minutes=30), orphan_grace=DAY
    )
    assert set(added.added) == {"a", "b"}
    result = schedules.sync([hourly("a", "30 * * * *")], now=T0, orphan_grace=DAY)
    assert result.changed == ("a",) and result.orphaned == () and result.undeclared == ("b",)
    rows = {row.id: row for row in schedules.all()}
    assert rows["a"].cron == "30 * * * *" and rows["a"].next_run_at == T0 + timedelta(minutes=30)
    # "b" is another release's: not orphaned, its next tick and declaration untouched.
    assert not rows["b"].orphaned and rows["b"].next_run_at == T0
    assert rows["b"].declared_at == T0 - timedelta(minutes=30)
    assert rows["a"].declared_at == T0
    # A second process syncing the same change from a stale read moves nothing back.
    again = schedules.sync([hourly("a", "30 * * * *")], now=T0, orphan_grace=DAY)
    assert again.changed == ()


def test_sync_orphans_only_what_no_code_declared_for_the_grace_period(
    schedules: ScheduleStore,
) -> None:
    schedules.sync([hourly("a"), hourly("b")], now=T0, orphan_grace=DAY)
    schedules.sync([hourly("a")], now=T0 + DAY - timedelta(seconds=1), orphan_grace=DAY)
    assert schedules.sync([], now=T0 + DAY, orphan_grace=DAY).orphaned == ()  # a: fresh
    result = schedules.sync([hourly("a")], now=T0 + DAY + timedelta(seconds=1), orphan_grace=DAY)
    assert result.orphaned == ("b",)
    rows = {row.id: row for row in schedules.all()}
    assert rows["b"].orphaned and not rows["a"].orphaned
    assert schedules.undeclared(before=T0 + 2 * DAY) == ["a"]  # orphaned ones are not listed


def test_refresh_keeps_a_running_release_declared_and_never_moves_back(
    schedules: ScheduleStore,
) -> None:
    schedules.sync([hourly("a"), hourly("b")], now=T0, orphan_grace=DAY)
    # A worker started at T0 that still runs a day later: its refreshes keep "a" live.
    assert schedules.refresh({"a"}, now=T0 + DAY - timedelta(hours=1), orphan_grace=DAY) == ()
    assert schedules.refresh({"a"}, now=T0 + DAY + timedelta(hours=1), orphan_grace=DAY) == (
        "b",
    )
    schedules.refresh({"a"}, now=T0, orphan_grace=DAY)  # run_due(now=<the past>)
    rows = {row.id: row for row in schedules.all()}
    assert not rows["a"].orphaned and rows["b"].orphaned
    assert rows["a"].declared_at == T0 + DAY + timedelta(hours=1)
    # Rules are the sync's business: a refresh never restarts a schedule.
    assert rows["a"].next_run_at == T0


def test_due_and_next_due_only_see_the_ids_the_caller_declares(
    schedules: ScheduleStore,
) -> None:
    schedules.sync([hourly("a"), hourly("b", "30 * * * *")], now=T0 - DAY, orphan_grace=DAY)
    assert [row.id for row in schedules.due(now=T0, ids={"b"})] == ["b"]
    assert schedules.due(now=T0, ids=set()) == []
    assert schedules.next_due({"b"}) == T0 - DAY + timedelta(minutes=30)
    assert schedules.next_due(set()) is None


def test_forget_orphans_a_schedule_once(schedules: ScheduleStore) -> None:
    schedules.sync([hourly("a")], now=T0, orphan_grace=DAY)
    assert schedules.forget("a", now=T0) is True
    assert schedules.forget("a", now=T0) is False
    assert schedules.due(now=T0 + DAY, ids={"a"}) == []
