"""The worker's handler pool (pool.py): the group start of queued jobs."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest

from flask_defer.jobs import Job, JobStatus
from flask_defer.pool import GroupStart

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def job(job_id: int) -> Job:
    return Job(
        id=job_id,
        name="noop",
        payload=None,
        status=JobStatus.RUNNING,
        run_at=NOW,
        due_at=NOW,
        attempts=0,
        max_attempts=3,
        queue="default",
    )


def test_threads_that_start_while_a_statement_runs_share_the_next_one() -> None:
    groups: list[list[int]] = []
    first_running = threading.Event()
    let_first_finish = threading.Event()

    def start_many(jobs: list[Job]) -> dict[int, Job | None]:
        groups.append([j.id for j in jobs])
        if len(groups) == 1:
            first_running.set()
            assert let_first_finish.wait(5)
        return {j.id: j for j in jobs}

    group = GroupStart(start_many)
    results: dict[int, Job | None] = {}

    def start(job_id: int) -> None:
        results[job_id] = group.start(job(job_id))

    first = threading.Thread(target=start, args=(1,))
    first.start()
    assert first_running.wait(5)
    others = [threading.Thread(target=start, args=(n,)) for n in (2, 3, 4)]
    for thread in others:
        thread.start()
    # The three wait behind the running statement; then one statement starts them all.
    deadline = time.monotonic() + 5
    while len(group._waiting) < 3 and time.monotonic() < deadline:
        time.sleep(0.001)
    let_first_finish.set()
    for thread in [first, *others]:
        thread.join(5)
    assert groups[0] == [1] and sorted(groups[1]) == [2, 3, 4] and len(groups) == 2
    assert {k: v.id if v else None for k, v in results.items()} == {1: 1, 2: 2, 3: 3, 4: 4}


def test_each_thread_gets_its_own_answer_a_lost_job_and_an_error_alike() -> None:
    calls = 0

    def start_many(jobs: list[Job]) -> dict[int, Job | None]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise ConnectionError("database went away")
        return {j.id: (None if j.id == 7 else j) for j in jobs if j.id != 8}

    group = GroupStart(start_many)
    started = group.start(job(6))
    assert started is not None and started.id == 6
    with pytest.raises(ConnectionError, match="went away"):
        group.start(job(9))
    assert group.start(job(7)) is None  # its claim was lost
    assert group.start(job(8)) is None  # not answered for: lost, never a hang
