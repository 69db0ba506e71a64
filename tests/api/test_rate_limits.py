"""Rate limits on both backends: ``@defer.job(..., rate_limit="N/s|m|h")`` and
``schedule(..., rate_key=)``. Counted at the claim (the job's ``started`` event), across
every worker: the checks read the started events, which are the claims' own times."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from flask_defer import InvalidArgument, Job, JobStatus
from flask_defer.timeutil import utcnow

from ..conftest import AppKit
from ..engine.test_worker import MakeKit, make_kit
from ..worker_helpers import wait_until, worker_thread

__all__ = ["make_kit"]


@pytest.fixture
def kit(make_kit: MakeKit) -> AppKit:
    kit = make_kit(DEFER_POLL_INTERVAL=0.05)
    kit.defer.job("sms", rate_limit="5/s")(lambda job: None)
    kit.defer.job("report", rate_limit="2/m")(lambda job: None)
    kit.defer.job("plain")(lambda job: None)
    return kit


def started_at(kit: AppKit, job_ids: list[int]) -> list[float]:
    """The claim times of *job_ids*, as seconds on one clock, sorted."""
    times = []
    for job_id in job_ids:
        (start,) = [e.at for e in kit.defer.history(job_id) if e.event == "started"]
        times.append(start.timestamp())
    return sorted(times)


def most_in_any_window(times: list[float], period: float) -> int:
    """The most starts in any half-open window of *period* seconds."""
    return max(sum(1 for t in times if a <= t < a + period) for a in times)


def test_a_worker_starts_at_most_the_limit_per_period(kit: AppKit) -> None:
    jobs = [kit.defer.schedule("sms", {"n": n}) for n in range(12)]
    kit.db.session.commit()
    assert (jobs[0].rate_limit, jobs[0].rate_period, jobs[0].concurrency_key) == (
        5, 1.0, "rate:sms",
    )  # fmt: skip
    with worker_thread(kit.defer.worker(concurrency=4)):
        wait_until(lambda: kit.defer.count(status="done") == 12, timeout=30)
    times = started_at(kit, [job.id for job in jobs])
    assert most_in_any_window(times, 1.0) <= 5, times
    # ...and it does not dawdle: 12 jobs at 5/s take a little over two periods.
    assert times[-1] - times[0] < 4.0, times


def test_each_rate_key_is_a_bucket_of_its_own(kit: AppKit) -> None:
    tenant_a = [kit.defer.schedule("report", {"n": n}, rate_key="tenant:a") for n in range(3)]
    tenant_b = [kit.defer.schedule("report", {"n": n}, rate_key="tenant:b") for n in range(3)]
    kit.db.session.commit()
    assert tenant_a[0].concurrency_key == "rate:report:tenant:a"
    summary = kit.defer.run_due()
    assert summary.ran == 4  # two per bucket this minute
    for jobs in (tenant_a, tenant_b):
        assert [kit.defer.get(j.id).status for j in jobs].count(JobStatus.DONE) == 2  # type: ignore[union-attr]


def test_jobs_over_the_limit_wait_and_the_wake_up_is_when_the_bucket_frees(
    kit: AppKit,
) -> None:
    for n in range(3):
        kit.defer.schedule("report", {"n": n})
    kit.db.session.commit()
    before = utcnow()
    assert kit.defer.run_due().ran == 2
    assert kit.defer.run_due().ran == 0  # the third waits for the minute
    store = kit.defer.store
    next_at = store.next_run_at(now=utcnow())
    assert next_at is not None
    # Not "now" (which would spin the worker) but when the first start stops counting.
    assert before + timedelta(seconds=59) < next_at < utcnow() + timedelta(seconds=61)
    assert kit.defer.run_due(now=next_at + timedelta(seconds=1)).ran == 1


def test_rate_limited_jobs_scheduled_in_bulk_recurring_or_batched_count_too(
    kit: AppKit,
) -> None:
    assert kit.defer.schedule_many("report", [{"n": n} for n in range(3)]) == 3
    kit.db.session.commit()
    pending = kit.defer.list(status="pending")
    assert {job.concurrency_key for job in pending} == {"rate:report"}
    assert kit.defer.run_due().ran == 2


def test_recurring_ticks_and_batches_of_a_rate_limited_handler_take_its_limit(
    kit: AppKit,
) -> None:
    kit.defer.recurring("reports", "report", every=timedelta(minutes=1))
    start = utcnow()
    kit.defer.run_due(now=start)  # the first sync: the next tick is a minute on
    kit.defer.pause(name="report")  # so the tick is written but not run
    kit.defer.run_due(now=start + timedelta(minutes=1, seconds=1))
    kit.defer.run_recurring_now("reports")
    for n in range(2):
        kit.defer.batch("report", key=f"digest:{n}", item={"n": n}, window=60)
    kit.db.session.commit()
    pending = kit.defer.list(status="pending", name="report")
    keys = sorted((job.key or "").split(":")[0] for job in pending)
    assert keys == ["digest", "digest", "recurring", "recurring"], keys
    assert {(job.concurrency_key, job.rate_limit, job.rate_period) for job in pending} == {
        ("rate:report", 2, 60.0)
    }
    kit.defer.resume(name="report")
    # All four due, one bucket of 2 a minute: two start, two wait.
    assert kit.defer.run_due(now=utcnow() + timedelta(minutes=3)).ran == 2


@pytest.mark.parametrize(
    ("limit", "named"),
    [("10", "rate_limit"), ("0/s", "rate_limit"), ("10/d", "rate_limit"),
     ("ten/s", "rate_limit"), (10, "rate_limit"), ("100001/s", "rate_limit")],
)  # fmt: skip
def test_a_bad_rate_limit_is_refused_at_the_decorator(
    kit: AppKit, limit: Any, named: str
) -> None:
    with pytest.raises(InvalidArgument) as raised:
        kit.defer.job("bad", rate_limit=limit)
    assert raised.value.argument == named


def test_rate_and_concurrency_limits_do_not_mix(kit: AppKit) -> None:
    with pytest.raises(InvalidArgument) as raised:
        kit.defer.job("both", rate_limit="1/s", concurrency_limit=2)
    assert raised.value.argument == "concurrency_limit"
    with pytest.raises(InvalidArgument) as raised:
        kit.defer.schedule("sms", concurrency_key="acct:1")
    assert raised.value.argument == "concurrency_key"


def test_rate_key_needs_a_rate_limited_handler(kit: AppKit) -> None:
    with pytest.raises(InvalidArgument) as raised:
        kit.defer.schedule("plain", rate_key="tenant:a")
    assert raised.value.argument == "rate_key"
    with pytest.raises(InvalidArgument) as raised:
        kit.defer.schedule("sms", rate_key="")
    assert raised.value.argument == "rate_key"


def test_maintenance_forgets_starts_that_no_longer_count(kit: AppKit) -> None:
    kit.defer.schedule("sms")
    kit.db.session.commit()
    kit.defer.run_due()
    store = kit.defer.store
    assert store.forget_old_starts(now=utcnow()) == 0  # still counts for a second
    assert store.forget_old_starts(now=utcnow() + timedelta(seconds=2)) == 1


def test_the_job_page_says_a_job_is_rate_limited(kit: AppKit) -> None:
    job: Job = kit.defer.schedule("report", rate_key="tenant:a")
    kit.db.session.commit()
    kit.defer.dashboard_auth(lambda: True)
    page = kit.app.test_client().get(f"/defer/jobs/{job.id}").get_data(as_text=True)
    assert "Rate limit" in page and "2 per minute" in page and "tenant:a" in page


def test_health_names_the_full_buckets_holding_due_jobs_back(kit: AppKit) -> None:
    for n in range(3):
        kit.defer.schedule("report", {"n": n}, rate_key="tenant:a")
    kit.defer.schedule("report", {"n": 9}, rate_key="tenant:b")
    kit.db.session.commit()
    assert kit.defer.health().rate_limited == ()  # nothing started yet: room everywhere
    kit.defer.run_due()
    health = kit.defer.health()
    assert health.rate_limited == ("rate:report:tenant:a",)  # b has room, and no job left
    assert health.owed == 1 and health.as_dict()["rate_limited"] == ["rate:report:tenant:a"]
    kit.defer.dashboard_auth(lambda: True)
    page = kit.app.test_client().get("/defer/").get_data(as_text=True)
    assert 'data-defer-figure="rate-limited"' in page and "rate:report:tenant:a" in page
    (waiting,) = [j for j in kit.defer.list(status="pending")]
    job_page = kit.app.test_client().get(f"/defer/jobs/{waiting.id}").get_data(as_text=True)
    assert "data-defer-rate-limited" in job_page and "rate limited: waits for room" in job_page
