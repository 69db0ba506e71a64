"""A model-based test of the store against a small reference model of the queue.

Hypothesis drives random sequences of what callers and workers do (schedule with keys,
concurrency keys and limits, priorities and times; cancel; reschedule; pause and resume
a queue; retry a dead letter; claim; acknowledge done, retry or failure; let a lease
lapse; let time pass) on both backends, and after every step checks the database
against the model:

* every job has the status the model says;
* no job is held by two claims, and no concurrency key runs more than its limit;
* a claim never leaves behind a claimable job more urgent than one it took;
* claiming until nothing comes back leaves nothing the model says could run.

Bounded so ``make test`` stays quick (``MODEL_EXAMPLES``); Hypothesis keeps no example
database in the repository (``.hypothesis/`` is ignored).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import delete, select

from flask_defer.jobs import Job
from flask_defer.store import JobStore, NewJob

#: Examples (sequences of steps) per backend; raise it locally to search harder.
MODEL_EXAMPLES = int(os.environ.get("DEFER_MODEL_EXAMPLES", "25"))
START = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)


@dataclass
class ModelJob:
    id: int
    queue: str
    priority: int
    run_at: datetime
    concurrency_key: str | None
    limit: int
    max_attempts: int
    status: str = "pending"
    attempts: int = 0
    token: str | None = None
    lease_until: datetime | None = None


@dataclass
class Model:
    jobs: dict[int, ModelJob] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)

    def running_of(self, key: str) -> int:
        return sum(
            1 for j in self.jobs.values() if j.status == "running" and j.concurrency_key == key
        )

    def claimable(self, now: datetime) -> list[ModelJob]:
        """Due pending jobs of unpaused queues; a keyed one only while its key's running
        jobs, plus the key's due jobs ahead of it in claim order, plus itself, are within
        its own limit (docs/queues.md: a job never counts on an earlier job of its key
        that waits, so with mixed limits a later job can start only where that waiting
        job's slot would still leave room)."""
        due = sorted(
            (
                j
                for j in self.jobs.values()
                if j.status == "pending" and j.run_at <= now and j.queue not in self.paused
            ),
            key=lambda j: (j.priority, j.run_at, j.id),
        )
        ahead: dict[str, int] = {}
        found = []
        for job in due:
            if job.concurrency_key is None:
                found.append(job)
                continue
            key = job.concurrency_key
            ahead.setdefault(key, self.running_of(key))
            ahead[key] += 1  # every due job of the key counts, started or not
            if ahead[key] <= job.limit:
                found.append(job)
        return found


class QueueMachine(RuleBasedStateMachine):
    """One store, one model; ``now`` moves forward only."""

    def __init__(self, store: JobStore) -> None:
        super().__init__()
        self.store = store
        with store.begin() as conn:
            if store.history_table is not None:
                conn.execute(delete(store.history_table))
            conn.execute(delete(store.pauses_table))
            conn.execute(delete(store.table))
        self.model = Model()
        self.now = START

    running = Bundle("running")

    # -- callers --------------------------------------------------------------------

    @rule(
        queue=st.sampled_from(["a", "b"]),
        priority=st.sampled_from([-5, 0, 5]),
        delay=st.sampled_from([-10, 0, 5, 60]),
        key=st.sampled_from([None, None, "k1", "k2"]),
        limit=st.integers(1, 2),
        max_attempts=st.integers(1, 3),
    )
    def schedule(
        self, queue: str, priority: int, delay: int, key: str | None, limit: int,
        max_attempts: int,
    ) -> None:  # fmt: skip
        run_at = self.now + timedelta(seconds=delay)
        new = NewJob(
            name="work", payload={}, run_at=run_at, max_attempts=max_attempts, queue=queue,
            priority=priority, concurrency_key=key, concurrency_limit=limit if key else None,
        )  # fmt: skip
        with self.store.begin() as conn:
            job = self.store.insert(conn, new, now=self.now, replace=False)
        self.model.jobs[job.id] = ModelJob(
            job.id, queue, priority, run_at, key, limit if key else 1, max_attempts
        )

    @precondition(lambda self: self.model.jobs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.model.jobs)))
        with self.store.begin() as conn:
            cancelled = self.store.cancel(conn, now=self.now, job_id=job_id)
        model = self.model.jobs[job_id]
        assert (cancelled is not None) == (model.status == "pending")
        if cancelled is not None:
            model.status = "cancelled"

    @precondition(lambda self: self.model.jobs)
    @rule(data=st.data(), delay=st.sampled_from([-10, 0, 30]))
    def reschedule(self, data: st.DataObject, delay: int) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.model.jobs)))
        when = self.now + timedelta(seconds=delay)
        with self.store.begin() as conn:
            moved = self.store.reschedule(conn, when, now=self.now, job_id=job_id)
        model = self.model.jobs[job_id]
        assert (moved is not None) == (model.status == "pending")
        if moved is not None:
            model.run_at = moved.run_at

    @rule(queue=st.sampled_from(["a", "b"]), pause=st.booleans())
    def pause_or_resume(self, queue: str, pause: bool) -> None:
        if pause:
            changed = self.store.pause(kind="queue", value=queue, now=self.now, actor="t")
            assert changed == (queue not in self.model.paused)
            self.model.paused.add(queue)
        else:
            changed = self.store.resume(kind="queue", value=queue)
            assert changed == (queue in self.model.paused)
            self.model.paused.discard(queue)

    @precondition(lambda self: any(j.status == "failed" for j in self.model.jobs.values()))
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        failed = sorted(j.id for j in self.model.jobs.values() if j.status == "failed")
        job_id = data.draw(st.sampled_from(failed))
        with self.store.begin() as conn:
            job = self.store.retry_failed(conn, job_id, now=self.now)
        assert job is not None
        model = self.model.jobs[job_id]
        model.status, model.attempts, model.run_at = "pending", 0, job.run_at

    # -- workers --------------------------------------------------------------------

    @rule(target=running, limit=st.integers(1, 4))
    def claim(self, limit: int) -> Job | object:
        expected = self.model.claimable(self.now)
        token = uuid.uuid4().hex
        claimed = self.store.claim(
            now=self.now, limit=limit, token=token, lease_until=self.now + LEASE
        )
        ids = {job.id for job in claimed}
        allowed = {job.id for job in expected}
        assert ids <= allowed, (ids - allowed, "claimed a job the model says may not run")
        assert len(claimed) <= limit
        if claimed:
            worst = max(job.priority for job in claimed)
            left = [j for j in expected if j.id not in ids]
            assert all(j.priority >= worst for j in left), "a more urgent job was left"
        for job in claimed:
            model = self.model.jobs[job.id]
            model.status, model.token = "running", token
            model.attempts += 1
            model.lease_until = self.now + LEASE
        return claimed[0] if claimed else object()

    @rule(job=consumes(running), outcome=st.sampled_from(["done", "retry", "failed"]))
    def acknowledge(self, job: Job | object, outcome: str) -> None:
        if not isinstance(job, Job):
            return
        model = self.model.jobs[job.id]
        later = self.now + timedelta(seconds=10)
        if outcome == "done":
            owned = self.store.ack_done(job, now=self.now)
        elif outcome == "retry" and model.attempts < model.max_attempts:
            owned = self.store.ack_retry(job, now=self.now, run_at=later, error="again")
        else:
            owned = self.store.ack_failed(job, now=self.now, error="broken")
            outcome = "failed"
        # A claim the model knows lost (lapsed and reclaimed) must not write.
        assert owned == (model.status == "running" and model.token == job.claim_token)
        if owned:
            model.token = None
            if outcome == "retry":
                model.status, model.run_at = "pending", later
            else:
                model.status = outcome

    @rule(seconds=st.sampled_from([1, 10, 31]))
    def time_passes(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    @rule()
    def reclaim(self) -> None:
        self.store.reclaim_lapsed(now=self.now)
        for model in self.model.jobs.values():
            lapsed = model.lease_until is not None and model.lease_until < self.now
            if model.status == "running" and lapsed:
                model.status = "failed" if model.attempts >= model.max_attempts else "pending"
                model.token = None

    # -- after every step -----------------------------------------------------------

    @invariant()
    def the_database_says_what_the_model_says(self) -> None:
        t = self.store.table
        with self.store.begin() as conn:
            rows = dict(conn.execute(select(t.c.id, t.c.status)).all())
        assert rows == {job_id: job.status for job_id, job in self.model.jobs.items()}

    @invariant()
    def no_key_runs_over_its_limit(self) -> None:
        for key in ("k1", "k2"):
            limits = [j.limit for j in self.model.jobs.values() if j.concurrency_key == key]
            if limits:
                assert self.model.running_of(key) <= max(limits)

    def teardown(self) -> None:
        # Claiming until nothing comes back leaves nothing the model says could run.
        while True:
            claimed = self.store.claim(
                now=self.now, limit=10, token=uuid.uuid4().hex, lease_until=self.now + LEASE
            )
            for job in claimed:
                model = self.model.jobs[job.id]
                model.status = "running"
                assert self.store.ack_done(job, now=self.now)
                model.status = "done"
            if not claimed:
                break
        assert self.model.claimable(self.now) == []


def test_the_store_keeps_to_the_reference_model_of_the_queue(store: JobStore) -> None:
    run_state_machine_as_test(
        lambda: QueueMachine(store),
        settings=settings(
            max_examples=MODEL_EXAMPLES,
            stateful_step_count=30,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
