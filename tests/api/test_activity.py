"""Activity on both backends: what workers and ``run_due`` ran, per minute and per hour,
by queue and name, with lateness percentiles (``defer.activity``), and the dashboard's
Activity page (server-drawn SVG with its table)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from flask_defer import ActivityBucket, InvalidArgument, Job
from flask_defer.store.activity import ActivityRow
from flask_defer.timeutil import utcnow

from ..conftest import AppKit
from ..engine.test_worker import MakeKit, make_kit
from ..worker_helpers import wait_until, worker_thread

__all__ = ["make_kit"]


@pytest.fixture
def kit(make_kit: MakeKit) -> AppKit:
    kit = make_kit()

    @kit.defer.job("send", queue="mail", max_attempts=2)
    def send(job: Job) -> None:
        if job.payload.get("fail"):
            raise RuntimeError("no")

    kit.defer.job("sync")(lambda job: None)
    return kit


def totals(buckets: list[ActivityBucket]) -> tuple[int, int, int, int]:
    return (
        sum(b.started for b in buckets), sum(b.done for b in buckets),
        sum(b.failed for b in buckets), sum(b.retried for b in buckets),
    )  # fmt: skip


def test_run_due_counts_every_run_by_outcome_queue_and_name(kit: AppKit) -> None:
    for n in range(3):
        kit.defer.schedule("send", {"n": n})
    kit.defer.schedule("send", {"fail": True})
    kit.defer.schedule("sync")
    kit.db.session.commit()
    kit.defer.run_due()  # 4 done (3 send, 1 sync), 1 retried
    kit.defer.run_due(now=utcnow() + timedelta(minutes=5))  # the retry fails for good
    assert totals(kit.defer.activity()) == (6, 4, 1, 1)
    assert totals(kit.defer.activity(bucket="hour")) == (6, 4, 1, 1)
    assert totals(kit.defer.activity(queue="mail")) == (5, 3, 1, 1)
    assert totals(kit.defer.activity(name="sync")) == (1, 1, 0, 0)
    (bucket, *_) = kit.defer.activity()
    assert bucket.start.second == 0 and bucket.start.tzinfo is not None
    assert bucket.lateness_p50 is not None and bucket.lateness_p95 is not None


def test_a_worker_writes_its_counts_every_few_seconds_and_at_its_stop(kit: AppKit) -> None:
    for n in range(20):
        kit.defer.schedule("sync", {"n": n})
    kit.db.session.commit()
    with worker_thread(kit.defer.worker(concurrency=2)):
        wait_until(lambda: kit.defer.count(status="done") == 20, timeout=30)
    assert totals(kit.defer.activity()) == (20, 20, 0, 0)


def test_two_writers_add_up_in_one_row(kit: AppKit) -> None:
    store = kit.defer.store
    minute = utcnow().replace(second=0, microsecond=0)
    for _ in range(2):  # two workers' flushes of the same minute
        row = ActivityRow(minute, "default", "sync", started=3, done=2, retried=1)
        row.lateness[0] = 3
        store.record_activity([row])
    (bucket,) = kit.defer.activity(since=minute - timedelta(minutes=1))
    assert (bucket.started, bucket.done, bucket.retried) == (6, 4, 2)
    assert bucket.lateness_p50 == 0.01 and bucket.lateness_p95 == 0.01


def test_old_rows_are_forgotten_and_bad_arguments_named(kit: AppKit) -> None:
    store = kit.defer.store
    old = datetime(2020, 1, 1, 10, 0, tzinfo=UTC)
    store.record_activity([ActivityRow(old, "default", "sync", started=1, done=1)])
    assert store.forget_old_activity(now=utcnow()) == 2  # its minute and its hour
    with pytest.raises(InvalidArgument) as raised:
        kit.defer.activity(bucket="day")
    assert raised.value.argument == "bucket"
    with pytest.raises(InvalidArgument) as raised:
        kit.defer.activity(since=datetime(2030, 1, 1))  # naive
    assert raised.value.argument == "since"


def test_the_activity_page_draws_both_charts_with_their_tables(kit: AppKit) -> None:
    kit.defer.schedule("send", {"n": 1})
    kit.defer.schedule("send", {"fail": True})
    kit.db.session.commit()
    kit.defer.run_due()
    client = kit.app.test_client()
    assert client.get("/defer/activity").status_code == 403
    kit.defer.dashboard_auth(lambda: True)
    page = client.get("/defer/activity").get_data(as_text=True)
    assert 'data-defer-chart="minute"' in page and 'data-defer-chart="hour"' in page
    assert page.count('class="defer-chart__done"') == 2  # a bar in each chart
    assert page.count('class="defer-chart__retried"') == 2
    assert '<option value="mail">mail</option>' in page
    only_sync = client.get("/defer/activity?name=sync").get_data(as_text=True)
    assert 'class="defer-chart__done"' not in only_sync and "No runs in this period." in only_sync
    fragment = client.get("/defer/activity", headers={"HX-Request": "true"}).get_data(as_text=True)
    assert fragment.lstrip().startswith('<div id="defer-activity"')
