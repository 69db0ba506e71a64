"""Queue controls through the public API, both backends: ``schedule(priority=,
concurrency_key=, concurrency_limit=, expires_at=, ttl=, queue=)``, the handler's
defaults, their checks, and what ``run_due`` and a real worker make of them."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flask_defer import InvalidArgument, Job, JobStatus, job_expired
from flask_defer.engine import maintenance
from flask_defer.undo import ToastState, UndoOutcome

from ..conftest import AppKit
from ..engine.test_worker import MakeKit, make_kit
from ..worker_helpers import wait_until, worker_thread

__all__ = ["make_kit"]  # the fixture, shared with the worker's own tests


@pytest.fixture
def kit(make_kit: MakeKit) -> AppKit:
    kit = make_kit()
    kit.defer.job("send")(lambda job: None)
    return kit


def stored(kit: AppKit, job_id: int) -> Job:
    job = kit.defer.get(job_id)
    assert job is not None
    return job


# -- the arguments ---------------------------------------------------------------------


def test_schedule_stores_each_control_and_ttl_counts_from_run_at(kit: AppKit) -> None:
    run_at = datetime.now(UTC) + timedelta(hours=1)
    job = kit.defer.schedule(
        "send", run_at=run_at, priority=-5, queue="urgent", concurrency_key="acct:1",
        concurrency_limit=3, ttl=timedelta(minutes=10),
    )  # fmt: skip
    kit.db.session.commit()
    again = stored(kit, job.id)
    assert (again.priority, again.queue, again.concurrency_key, again.concurrency_limit) == (
        -5, "urgent", "acct:1", 3,
    )  # fmt: skip
    assert again.expires_at == run_at + timedelta(minutes=10) == job.expires_at


def test_the_handlers_defaults_apply_and_schedule_overrides_them(make_kit: MakeKit) -> None:
    kit = make_kit()
    kit.defer.job("sync", queue="sync", priority=7, concurrency_limit=2, ttl=60)(lambda j: None)
    plain = kit.defer.schedule("sync", concurrency_key="acct:9")
    own = kit.defer.schedule("sync", priority=0, concurrency_key="acct:9", concurrency_limit=1)
    assert (plain.queue, plain.priority, plain.concurrency_limit) == ("sync", 7, 2)
    assert plain.expires_at == plain.run_at + timedelta(seconds=60)
    assert (own.priority, own.concurrency_limit) == (0, 1)
    keyless = kit.defer.schedule("sync")
    assert keyless.concurrency_key is None and keyless.concurrency_limit is None


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"priority": 101}, "priority"),
        ({"priority": True}, "priority"),
        ({"priority": "1"}, "priority"),
        ({"concurrency_limit": 2}, "concurrency_limit"),  # no key to count by
        ({"concurrency_key": "k", "concurrency_limit": 0}, "concurrency_limit"),
        ({"concurrency_key": ""}, "concurrency_key"),
        ({"concurrency_key": 42}, "concurrency_key"),
        ({"ttl": 0}, "ttl"),
        ({"ttl": -1}, "ttl"),
        ({"expires_at": datetime(2030, 1, 1)}, "expires_at"),  # naive
        ({"expires_at": datetime(2000, 1, 1, tzinfo=UTC)}, "expires_at"),  # before run_at
        ({"expires_at": datetime(2100, 1, 1, tzinfo=UTC), "ttl": 5}, "ttl"),
        ({"queue": ""}, "queue"),
    ],
)
def test_a_bad_control_is_refused_naming_its_argument(
    kit: AppKit, arguments: dict[str, Any], named: str
) -> None:
    with pytest.raises(InvalidArgument) as refused:
        kit.defer.schedule("send", **arguments)
    assert refused.value.argument == named
    assert kit.defer.list() == []


def test_a_bad_handler_default_is_refused_at_the_decorator(kit: AppKit) -> None:
    for arguments, named in (({"priority": -101}, "priority"), ({"ttl": 0}, "ttl"),
                             ({"concurrency_limit": 10_001}, "concurrency_limit")):  # fmt: skip
        with pytest.raises(InvalidArgument) as refused:
            kit.defer.job("other", **arguments)
        assert refused.value.argument == named


def test_schedule_many_takes_priority_and_ttl_for_every_job(kit: AppKit) -> None:
    assert kit.defer.schedule_many("send", [{"n": 1}, {"n": 2}], priority=3, ttl=30) == 2
    kit.db.session.commit()
    jobs = kit.defer.list()
    assert {job.priority for job in jobs} == {3}
    assert all(job.expires_at == job.run_at + timedelta(seconds=30) for job in jobs)
    with pytest.raises(InvalidArgument) as refused:
        kit.defer.schedule_many("send", [{}], priority=1000)
    assert refused.value.argument == "priority"


# -- what runs -------------------------------------------------------------------------


def test_run_due_runs_due_jobs_most_urgent_first(make_kit: MakeKit) -> None:
    kit = make_kit()
    order: list[str] = []
    kit.defer.job("record")(lambda job: order.append(job.payload["what"]))
    now = datetime.now(UTC)
    for what, priority in (("bulk", 10), ("normal", 0), ("urgent", -10), ("normal too", 0)):
        kit.defer.schedule("record", {"what": what}, priority=priority)
    kit.defer.schedule("record", {"what": "later"}, priority=-100, run_at=now + timedelta(hours=1))
    kit.db.session.commit()
    kit.defer.run_due()
    assert order == ["urgent", "normal", "normal too", "bulk"]


def test_run_due_expires_a_job_past_its_expiry_with_history_health_and_toast(
    make_kit: MakeKit,
) -> None:
    kit = make_kit()
    ran: list[int] = []
    kit.defer.job("code")(lambda job: ran.append(job.id))
    job = kit.defer.schedule(
        "code", key="code:ann", ttl=timedelta(minutes=10), owner="ann", label="Code sent"
    )
    kit.db.session.commit()
    kit.defer.run_due(now=datetime.now(UTC) + timedelta(minutes=11))
    expired = stored(kit, job.id)
    assert ran == [] and expired.status is JobStatus.EXPIRED
    assert [event.event for event in kit.defer.history(job.id)] == ["scheduled", "expired"]
    assert kit.defer.health().counts["expired"] == 1
    assert ToastState.of(expired, datetime.now(UTC)) is ToastState.FAILED
    assert UndoOutcome.for_status(expired.status) is UndoOutcome.EXPIRED
    # Settled: its key is free, so the same intent can be scheduled again.
    assert kit.defer.schedule("code", key="code:ann").status is JobStatus.PENDING


def test_an_expired_job_is_announced_by_the_job_expired_signal(make_kit: MakeKit) -> None:
    kit = make_kit()
    kit.defer.job("code")(lambda job: None)
    heard: list[tuple[Any, Job]] = []

    def listener(sender: Any, job: Job, **_: Any) -> None:
        heard.append((sender, job))

    job = kit.defer.schedule("code", ttl=timedelta(minutes=10))
    kit.db.session.commit()
    with job_expired.connected_to(listener):
        kit.defer.run_due(now=datetime.now(UTC) + timedelta(minutes=11))
        kit.defer.run_due(now=datetime.now(UTC) + timedelta(minutes=12))  # settled once
    assert [(sender, j.id, j.status) for sender, j in heard] == [
        (kit.app, job.id, JobStatus.EXPIRED)
    ]


def test_a_worker_runs_one_job_of_a_key_at_a_time_and_others_beside_it(
    make_kit: MakeKit,
) -> None:
    kit = make_kit(DEFER_WORKER_CONCURRENCY=6)
    lock = threading.Lock()
    running: dict[str, int] = {}
    most: dict[str, int] = {}

    def slow(job: Job) -> None:
        key = job.concurrency_key or ""
        with lock:
            running[key] = running.get(key, 0) + 1
            most[key] = max(most.get(key, 0), running[key])
        time.sleep(0.05)
        with lock:
            running[key] -= 1

    kit.defer.job("sync")(slow)
    for n in range(4):
        kit.defer.schedule("sync", {"n": n}, concurrency_key="acct:1")
        kit.defer.schedule("sync", {"n": n}, concurrency_key="acct:2", concurrency_limit=2)
    kit.db.session.commit()
    with worker_thread(kit.defer.worker()):
        wait_until(lambda: all(j.status is JobStatus.DONE for j in kit.defer.list(limit=20)))
    assert most == {"acct:1": 1, "acct:2": 2}


def test_a_worker_settles_an_expired_job_in_its_claim_loop_not_at_the_next_reclaim(
    make_kit: MakeKit,
) -> None:
    kit = make_kit(DEFER_RECLAIM_INTERVAL=600)  # the maintenance round will not come
    kit.defer.job("send")(lambda job: None)
    kit.defer.pause(name="send")  # nothing may start it: it can only expire
    with worker_thread(kit.defer.worker()):
        wait_until(lambda: kit.defer.workers() != [], timeout=10)
        time.sleep(0.5)  # past the maintenance round at its start
        # Scheduled only now, so that round cannot be what expires it.
        job = kit.defer.schedule("send", ttl=0.3)
        kit.db.session.commit()
        wait_until(lambda: stored(kit, job.id).status is JobStatus.EXPIRED, timeout=3)


def test_a_job_added_just_after_the_workers_expiry_look_expires_at_the_next_look(
    make_kit: MakeKit, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The looks are spaced wide, so the job lands between two of them: the wake its
    # NOTIFY brings (PostgreSQL) comes too soon for a look and must set the next one,
    # not leave the worker asleep until DEFER_MAX_SLEEP.
    monkeypatch.setattr(maintenance, "EXPIRY_CHECK_SECONDS", 2.0)
    kit = make_kit(DEFER_RECLAIM_INTERVAL=600, DEFER_MAX_SLEEP=30)
    kit.defer.job("send")(lambda job: None)
    kit.defer.pause(name="send")  # nothing may start it: it can only expire
    with worker_thread(kit.defer.worker()):
        wait_until(lambda: kit.defer.workers() != [], timeout=10)
        time.sleep(0.2)  # after the look at the worker's start, well before the next
        job = kit.defer.schedule("send", ttl=0.3)
        kit.db.session.commit()
        wait_until(lambda: stored(kit, job.id).status is JobStatus.EXPIRED, timeout=8)


def test_the_dashboard_shows_a_pending_job_past_its_expiry_as_expired(make_kit: MakeKit) -> None:
    kit = make_kit()
    kit.defer.job("send")(lambda job: None)
    job = kit.defer.schedule("send", ttl=0.05)
    kit.db.session.commit()
    time.sleep(0.1)  # past expires_at, not swept: no worker runs
    kit.defer.dashboard_auth(lambda: True)
    page = kit.app.test_client().get(f"/defer/jobs/{job.id}").get_data(as_text=True)
    assert 'class="defer-badge defer-badge--expired">expired</span>' in page
    assert stored(kit, job.id).status is JobStatus.PENDING
