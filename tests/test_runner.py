"""The runner: the one claim → execute → acknowledge path of run_due and the worker."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from flask_defer import Job, JobStatus, runner
from flask_defer.store import JobStore

from .conftest import AppKit


def test_run_due_and_the_worker_claim_through_the_same_function(
    kit: AppKit, now: datetime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change to ``runner.claim_due`` is seen by both: here, one job per claim."""
    real = runner.claim_due
    claimed: list[list[int]] = []

    def one_at_a_time(store: JobStore, **kwargs: Any) -> list[Job]:
        kwargs["limit"] = 1
        jobs = real(store, **kwargs)
        claimed.append([job.payload["n"] for job in jobs])
        return jobs

    monkeypatch.setattr(runner, "claim_due", one_at_a_time)
    ran: list[int] = []

    @kit.defer.job("note")
    def note(job: Job) -> None:
        ran.append(job.payload["n"])

    for n in (1, 2):
        kit.defer.schedule("note", {"n": n}, run_at=now)
    kit.db.session.commit()
    summary = kit.defer.run_due(now=now + timedelta(seconds=1))
    assert summary.ran == 2
    assert claimed == [[1], [2], []]  # run_due: one job per claim, then nothing left

    claimed.clear()
    for n in (3, 4):
        kit.defer.schedule("note", {"n": n}, run_at=now)
    kit.db.session.commit()
    worker = kit.defer.worker(burst=True, clock=lambda: now + timedelta(seconds=2))
    worker.run(install_signal_handlers=False)
    assert sorted(ran) == [1, 2, 3, 4]
    # The worker claimed through the same function, so it too took one job at a time.
    assert sorted(n for batch in claimed for n in batch) == [3, 4]
    assert all(len(batch) <= 1 for batch in claimed)
    assert kit.defer.count(status=JobStatus.PENDING) == 0


def test_the_worker_and_run_due_share_one_runner_class(kit: AppKit) -> None:
    worker = kit.defer.worker(burst=True)
    assert isinstance(worker.runner, runner.Runner)
    state = kit.app.extensions["defer"]
    assert isinstance(state.runner, runner.Runner)
    assert worker.runner.executor is state.runner.executor


def test_runner_claims_at_most_its_claim_batch(kit: AppKit, now: datetime) -> None:
    """``Runner.claim`` caps a claim at DEFER_CLAIM_BATCH whatever limit is asked."""
    @kit.defer.job("note")
    def note(job: Job) -> None:
        pass

    for n in range(kit.defer.config.claim_batch + 3):
        kit.defer.schedule("note", {"n": n})
    kit.db.session.commit()
    state = kit.app.extensions["defer"]
    claimed = state.runner.claim(now + timedelta(seconds=1), 1000)
    assert len(claimed) == kit.defer.config.claim_batch
    state.store.release(claimed, now=now)
