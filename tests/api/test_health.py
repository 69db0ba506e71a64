"""defer.health() over a constructed mix of jobs, on both backends."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from flask_defer import Job

from ..conftest import AppKit


def test_health_figures_for_a_mix_of_future_due_failed_lapsed_and_unknown(kit: AppKit) -> None:
    defer = kit.defer

    @defer.job("send_email", max_attempts=1)
    def send_email(job: Job) -> None:
        raise RuntimeError("smtp down")

    @defer.job("publish")
    def publish(job: Job) -> None:
        pass

    @defer.job("retired")
    def retired(job: Job) -> None:
        pass

    # A worker claims "lapsed" and dies: its lease runs out.
    defer.schedule("publish", key="lapsed")
    kit.db.session.commit()
    now = datetime.now(UTC)
    (claimed,) = defer.store.claim(
        now=now, limit=10, token=uuid.uuid4().hex, lease_until=now + timedelta(seconds=5)
    )
    assert claimed.key == "lapsed"

    defer.schedule("publish", delay=timedelta(days=30))  # scheduled, not a backlog
    defer.schedule("publish", delay=timedelta(days=60))
    defer.schedule("send_email")  # will fail: a dead letter
    defer.schedule("publish")  # due: owed
    defer.schedule("retired")  # owed, and its handler will be gone
    kit.db.session.commit()
    now = datetime.now(UTC)
    defer.run_due(now=now, limit=1)  # runs send_email (run_at order) → failed
    defer.registry._specs.pop("retired")  # a rolling deploy removed the handler

    health = defer.health(now=now + timedelta(minutes=1))
    assert health.counts == {
        "pending": 4, "running": 1, "done": 0, "failed": 1, "cancelled": 0, "expired": 0
    }
    assert health.scheduled == 2
    assert health.owed == 3  # publish (due), retired (due), lapsed (running)
    assert health.failed == 1
    assert health.lapsed_leases == 1
    assert health.unknown_handlers == 1
    assert health.oldest_owed_age is not None and 55 <= health.oldest_owed_age <= 65
    assert not health.ok

    names = [h.name for h in health.by_name]
    assert names[0] == "publish"  # the worst backlog first
    publish_health = health.by_name[0]
    assert publish_health.owed == 2 and publish_health.scheduled == 2
    retired_health = next(h for h in health.by_name if h.name == "retired")
    assert retired_health.unknown and retired_health.owed == 1
    email = next(h for h in health.by_name if h.name == "send_email")
    assert email.failed == 1 and email.owed == 0
    assert health.as_dict()["by_name"][0]["name"] == "publish"


def test_a_job_due_next_month_is_not_a_backlog(kit: AppKit) -> None:
    @kit.defer.job("close_booking")
    def close_booking(job: Job) -> None:
        pass

    kit.defer.schedule("close_booking", delay=timedelta(days=31))
    kit.db.session.commit()
    health = kit.defer.health()
    assert health.owed == 0 and health.oldest_owed_age is None and health.scheduled == 1
    assert health.ok


def test_oldest_owed_age_counts_from_when_the_job_became_due_not_from_its_retry(
    kit: AppKit,
) -> None:
    @kit.defer.job("flaky", max_attempts=10)
    def flaky(job: Job) -> None:
        raise RuntimeError("down")

    job = kit.defer.schedule("flaky")
    kit.db.session.commit()
    start = datetime.now(UTC)
    kit.defer.run_due(now=start)
    retry_at = kit.defer.get(job.id).run_at  # type: ignore[union-attr]
    health = kit.defer.health(now=retry_at + timedelta(minutes=10))
    assert health.owed == 1
    assert health.oldest_owed_age is not None
    assert health.oldest_owed_age >= (retry_at - job.due_at).total_seconds() + 600 - 1


def test_per_name_figures_of_a_days_mix_worst_backlog_first(database_url: str) -> None:
    from ..dashboard_app import create_app, seed

    ops = create_app(database_url, TESTING=True)
    try:
        seed(ops)
        with ops.context():
            health = ops.defer.health()
    finally:
        ops.dispose()
    assert health.counts == {
        "pending": 5, "running": 1, "done": 4, "failed": 1, "cancelled": 2, "expired": 0
    }
    assert (health.scheduled, health.owed, health.failed) == (3, 3, 1)
    assert health.oldest_owed_age is not None and 240 <= health.oldest_owed_age < 300
    by_name = {item.name: item for item in health.by_name}
    assert [item.name for item in health.by_name] == [
        "send_email",  # 2 owed, the oldest 4 min
        "publish_post",  # 1 owed (running)
        "close_booking",
        "sync_invoices",
    ]
    email = by_name["send_email"]
    assert (email.owed, email.scheduled, email.counts["done"], email.counts["cancelled"]) == (
        2,
        1,
        3,
        1,
    )
    assert by_name["sync_invoices"].failed == 1 and by_name["sync_invoices"].owed == 0
    assert by_name["close_booking"].owed == 0 and by_name["close_booking"].oldest_owed_age is None
    assert not any(item.unknown for item in health.by_name)
