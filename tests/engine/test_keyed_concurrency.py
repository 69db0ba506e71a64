"""Per-key concurrency in a real worker, on both backends: burst runs that finish the
work, the next job of a key started when the slot frees, a key held through a
handler's timeout, and priority ordering keyed and unkeyed jobs alike."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from flask_defer import Job, JobStatus
from flask_defer.timeutil import utcnow

from ..worker_helpers import wait_until, worker_thread
from .test_worker import MakeKit, burst, make_kit

__all__ = ["make_kit"]


class Overlap:
    """How many handlers of one key ran at once, at most."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.order: list[str] = []

    def enter(self, name: str) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.order.append(name)

    def leave(self) -> None:
        with self._lock:
            self.now -= 1


def test_a_burst_run_ends_only_when_every_job_of_a_limited_key_ran(make_kit: MakeKit) -> None:
    kit = make_kit()
    overlap = Overlap()

    @kit.defer.job("sync")
    def sync(job: Job) -> None:
        overlap.enter(str(job.id))
        time.sleep(0.02)
        overlap.leave()

    for _ in range(8):
        kit.defer.schedule("sync", concurrency_key="tenant:1", concurrency_limit=2)
    kit.db.session.commit()
    summary = burst(kit, concurrency=4)
    assert summary.done == 8 and summary.left == 0
    assert kit.defer.count(status="done") == 8
    assert overlap.most <= 2


def test_a_burst_run_does_not_end_on_a_look_taken_before_the_key_freed(
    make_kit: MakeKit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round claims nothing (the key's two jobs run) and looks for the next due job:
    none fits while they run. By the time the burst decides whether to end, their
    outcomes are written and the key is free: it must look again, not end with the rest
    of the key left. The handlers here wait until that look has been taken, and the look
    returns only once their outcomes are written, as a busy host can order it."""
    kit = make_kit(DEFER_MAX_SLEEP=0.2)
    store = kit.defer.store
    release = threading.Event()
    ran: list[int] = []

    @kit.defer.job("sync")
    def sync(job: Job) -> None:
        assert release.wait(10)
        ran.append(job.id)

    for _ in range(6):
        kit.defer.schedule("sync", concurrency_key="tenant:1", concurrency_limit=2)
    kit.db.session.commit()
    look, claim = store.next_run_at, store.claim
    claiming = threading.local()
    looks_while_running: list[int] = []

    def claim_saying_so(*args: Any, **kwargs: Any) -> Any:
        claiming.now = True  # SQLite's claim looks first: not the round's look
        try:
            return claim(*args, **kwargs)
        finally:
            claiming.now = False

    def next_run_at_while_the_key_frees(*args: Any, **kwargs: Any) -> Any:
        running = kit.defer.count(status="running")
        answer = look(*args, **kwargs)
        if running and not getattr(claiming, "now", False):
            looks_while_running.append(running)
            if len(looks_while_running) >= 2:  # a round that claimed nothing: let them end
                release.set()
                assert wait_until(lambda: kit.defer.count(status="running") == 0, timeout=10)
                time.sleep(0.3)  # and the flusher is back from writing them
        return answer

    monkeypatch.setattr(store, "claim", claim_saying_so)
    monkeypatch.setattr(store, "next_run_at", next_run_at_while_the_key_frees)
    summary = burst(kit, concurrency=4)
    release.set()
    assert len(looks_while_running) >= 2  # the stale look happened
    assert (summary.done, summary.left) == (6, 0)
    assert len(ran) == 6


def test_a_burst_run_says_what_a_pause_left_and_still_ends(make_kit: MakeKit) -> None:
    kit = make_kit()

    @kit.defer.job("sync")
    def sync(job: Job) -> None:
        pass

    kit.defer.schedule("sync", queue="held")
    kit.defer.schedule("sync")
    kit.db.session.commit()
    kit.defer.pause(queue="held")
    summary = burst(kit)
    assert (summary.done, summary.left) == (1, 1)
    assert "left 1 due job(s)" in summary.text()


def test_the_next_job_of_a_key_starts_when_the_slot_frees_not_at_the_next_poll(
    make_kit: MakeKit,
) -> None:
    # A poll and a reclaim far longer than the whole run: only the freed slot can
    # make the worker claim the next job of the key in time.
    kit = make_kit(DEFER_POLL_INTERVAL=5, DEFER_RECLAIM_INTERVAL=30, DEFER_MAX_SLEEP=30)
    starts: list[float] = []

    @kit.defer.job("sync")
    def sync(job: Job) -> None:
        starts.append(time.monotonic())
        time.sleep(0.05)

    for _ in range(6):
        kit.defer.schedule("sync", concurrency_key="tenant:1", concurrency_limit=1)
    kit.db.session.commit()
    with worker_thread(kit.defer.worker(concurrency=4)):
        wait_until(lambda: kit.defer.count(status="done") == 6, timeout=10)
    gaps = [later - earlier for earlier, later in zip(starts, starts[1:], strict=False)]
    assert len(starts) == 6 and max(gaps) < 1.0, gaps


def test_a_timed_out_handler_keeps_its_key_until_its_thread_ends(make_kit: MakeKit) -> None:
    kit = make_kit(DEFER_RETRY_BASE=0.01)
    overlap = Overlap()

    @kit.defer.job("slow", timeout=0.3, max_attempts=1)
    def slow(job: Job) -> None:
        overlap.enter(str(job.id))
        time.sleep(1.0)
        overlap.leave()

    for _ in range(3):
        kit.defer.schedule("slow", concurrency_key="tenant:1", concurrency_limit=1)
    kit.db.session.commit()
    with worker_thread(kit.defer.worker(concurrency=4)):
        wait_until(lambda: kit.defer.count(status="failed") == 3, timeout=20)
    assert overlap.most == 1
    for job in kit.defer.list(status="failed"):
        assert "timeout" in (job.last_error or "")


def test_priority_orders_keyed_and_unkeyed_jobs_alike(make_kit: MakeKit) -> None:
    kit = make_kit()
    overlap = Overlap()

    @kit.defer.job("work")
    def work(job: Job) -> None:
        overlap.enter(job.payload["name"])
        overlap.leave()

    due = utcnow() - timedelta(seconds=1)
    kit.defer.schedule(
        "work", {"name": "keyed"}, run_at=due, priority=100, concurrency_key="tenant:1"
    )
    for n in range(3):
        kit.defer.schedule("work", {"name": f"urgent {n}"}, run_at=due, priority=-100)
    kit.db.session.commit()
    burst(kit, concurrency=1)
    assert overlap.order == ["urgent 0", "urgent 1", "urgent 2", "keyed"]
    kit.defer.schedule("work", {"name": "keyed first"}, priority=-100, concurrency_key="k")
    kit.defer.schedule("work", {"name": "after"}, priority=100)
    kit.db.session.commit()
    burst(kit, concurrency=1)
    assert overlap.order[-2:] == ["keyed first", "after"]
    assert kit.defer.count(status=JobStatus.DONE) == 6
