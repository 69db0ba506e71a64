"""The schedules store over a bare engine (no Flask), on SQLite and PostgreSQL.

The compare-and-set that makes a tick exactly-once is checked directly here: two
advances from the same read row, and many threads racing for one due tick.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, MetaData

from flask_defer.recurrence import RecurringSpec, make_rule, make_spec, tick_key
from flask_defer.schema import define_jobs_table, define_schedules_table
from flask_defer.store import JobStore, NewJob
from flask_defer.store.schedules import ScheduleRow, ScheduleStore

T0 = datetime(2026, 3, 1, 10, tzinfo=UTC)


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
    schedules.sync([hourly()], now=T0 - timedelta(minutes=30))
    (row,) = schedules.due(now=T0)
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
    assert schedules.due(now=T0) == []


def test_threads_racing_for_one_due_tick_write_exactly_one_job(
    schedules: ScheduleStore,
) -> None:
    schedules.sync([hourly()], now=T0 - timedelta(minutes=30))
    (row,) = schedules.due(now=T0)
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
    schedules.sync([hourly()], now=T0 - timedelta(minutes=30))
    (row,) = schedules.due(now=T0)
    assert schedules.pause("hourly", now=T0)
    assert schedules.advance(row, next_tick=T0, ticks=[tick_job(row, T0)], now=T0) is None
    assert schedules.next_due() is None  # paused: not a live schedule


def test_sync_adds_restarts_a_changed_rule_and_orphans_the_undeclared(
    schedules: ScheduleStore,
) -> None:
    added = schedules.sync(
        [hourly("a"), hourly("b")], now=T0 - timedelta(minutes=30)
    )
    assert set(added.added) == {"a", "b"}
    result = schedules.sync([hourly("a", "30 * * * *")], now=T0)
    assert result.changed == ("a",) and result.orphaned == ("b",)
    rows = {row.id: row for row in schedules.all()}
    assert rows["a"].cron == "30 * * * *" and rows["a"].next_run_at == T0 + timedelta(minutes=30)
    assert rows["b"].orphaned and schedules.late(before=T0 + timedelta(days=1))[0] == 1
    # A second process syncing the same change from a stale read moves nothing back.
    assert schedules.sync([hourly("a", "30 * * * *")], now=T0).changed == ()
