"""The worker in this process, on SQLite and PostgreSQL: timeouts, snoozes, atomic
handlers, signals, leases, wake-ups and shutdown.

Tests that only need "what is due at time T" run the worker in burst mode with an
injected clock. The few that must prove wall-clock behaviour (a timeout, a heartbeat,
waking at ``run_at`` or on NOTIFY) run a real worker thread and poll for the outcome.
"""

from __future__ import annotations

import gc
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Integer, String, event, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Mapped, mapped_column

from flask_defer import InvalidArgument, Job, JobStatus, NotYet, RetryAfter, signals
from flask_defer.engine.logs import JsonFormatter
from flask_defer.store import NewJob
from flask_defer.timeutil import utcnow

from ..conftest import AppKit
from ..worker_helpers import wait_for_handler_threads, wait_until, worker_thread

MakeKit = Callable[..., AppKit]


@pytest.fixture
def make_kit(make_app: Callable[..., AppKit]) -> Iterator[MakeKit]:
    """Factory: an app with tables created and its context pushed for the test.

    Worker defaults suit tests: quick polls and reclaims, so nothing waits for long.
    """
    with ExitStack() as stack:

        def make(**config: Any) -> AppKit:
            settings = {"DEFER_POLL_INTERVAL": 0.05, "DEFER_RECLAIM_INTERVAL": 0.1}
            settings.update(config)
            kit = make_app(**settings)
            ctx = kit.app.app_context()
            ctx.push()
            stack.callback(ctx.pop)
            stack.callback(kit.db.session.rollback)
            kit.db.create_all()
            return kit

        yield make


#: Polls, idle sleeps and maintenance rounds far longer than any test: a worker so set
#: starts a job in time only if a wake-up (a NOTIFY, an outcome, a due time) brings it.
ONLY_WAKE_UPS: dict[str, Any] = {
    "DEFER_POLL_INTERVAL": 30,
    "DEFER_MAX_SLEEP": 30,
    "DEFER_RECLAIM_INTERVAL": 30,
}


def load(kit: AppKit, job_id: int) -> Job:
    """The job as the database has it now (a fresh read, outside db.session)."""
    store = kit.defer.store
    with store.begin() as conn:
        job = store.get(conn, job_id=job_id)
    assert job is not None
    return job


def burst(kit: AppKit, at: datetime | None = None, **options: Any) -> Any:
    clock = (lambda: at) if at is not None else None
    worker = kit.defer.worker(burst=True, clock=clock, **options)
    return worker.run(install_signal_handlers=False)


# -- burst runs ----------------------------------------------------------------------


def test_burst_runs_what_is_due_and_leaves_the_future(make_kit: MakeKit, now: datetime) -> None:
    kit = make_kit()
    ran: list[int] = []

    @kit.defer.job("note")
    def note(job: Job) -> int:
        ran.append(job.payload["n"])
        return int(job.payload["n"]) * 2

    due = [kit.defer.schedule("note", {"n": n}, run_at=now) for n in range(25)]
    later = kit.defer.schedule("note", {"n": 99}, run_at=now + timedelta(minutes=5))
    kit.db.session.commit()

    summary = burst(kit, at=now, concurrency=3)

    assert summary.done == 25 and summary.ran == 25
    assert sorted(ran) == list(range(25))
    assert all(load(kit, job.id).status is JobStatus.DONE for job in due)
    assert load(kit, due[3].id).result == 6
    assert load(kit, later.id).status is JobStatus.PENDING


def test_the_loop_and_flusher_keep_their_connections_and_give_them_back_at_the_end(
    make_kit: MakeKit, now: datetime, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL the loop's claims and the flusher's batches each run on a
    connection kept while busy (fewer plans on the server), not one checkout each; on
    both backends none stays checked out once the worker returns."""
    kit = make_kit()

    @kit.defer.job("noop")
    def noop(job: Job) -> None:
        pass

    for n in range(60):
        kit.defer.schedule("noop", {"n": n}, run_at=now)
    kit.db.session.commit()
    store = kit.defer.store
    calls: dict[str, int] = {"claim": 0, "acknowledge_many": 0}
    checkouts: dict[str, int] = {"claim": 0, "acknowledge_many": 0}
    inside = threading.local()

    def counted(name: str) -> Callable[..., Any]:
        real = getattr(store, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            inside.name = name
            try:
                return real(*args, **kwargs)
            finally:
                inside.name = None

        return call

    def checked_out(*_args: Any) -> None:
        name = getattr(inside, "name", None)
        if name is not None:
            checkouts[name] += 1

    for name in calls:
        monkeypatch.setattr(store, name, counted(name))
    event.listen(store.engine, "checkout", checked_out)
    try:
        summary = burst(kit, at=now, concurrency=3)
    finally:
        event.remove(store.engine, "checkout", checked_out)

    assert summary.done == 60
    assert store.engine.pool.checkedout() == 0
    if backend == "postgresql":
        assert calls["claim"] >= 20 and calls["acknowledge_many"] >= 4, calls
        # One checkout each while busy (two if a slow host let one sit a second).
        assert checkouts["claim"] <= 2 and checkouts["acknowledge_many"] <= 2, checkouts


def test_queue_option_runs_only_those_queues(make_kit: MakeKit, now: datetime) -> None:
    kit = make_kit()
    kit.defer.job("mail", queue="mail")(lambda job: None)
    kit.defer.job("report", queue="reports")(lambda job: None)
    mail = kit.defer.schedule("mail", run_at=now)
    report = kit.defer.schedule("report", run_at=now)
    kit.db.session.commit()

    assert burst(kit, at=now, queues=["mail"]).done == 1

    assert load(kit, mail.id).status is JobStatus.DONE
    assert load(kit, report.id).status is JobStatus.PENDING


def test_not_yet_and_retry_after_through_the_worker(make_kit: MakeKit) -> None:
    kit = make_kit()

    @kit.defer.job("wait_for_confirmation")
    def wait_for_confirmation(job: Job) -> None:
        raise NotYet(timedelta(hours=1))

    @kit.defer.job("rate_limited", max_attempts=3)
    def rate_limited(job: Job) -> None:
        raise RetryAfter(120, "the API said 429")

    waiting = kit.defer.schedule("wait_for_confirmation")
    limited = kit.defer.schedule("rate_limited")
    kit.db.session.commit()
    before = utcnow()

    summary = burst(kit)

    assert summary.snoozed == 1 and summary.retried == 1
    snoozed = load(kit, waiting.id)
    assert snoozed.status is JobStatus.PENDING and snoozed.attempts == 0
    assert timedelta(minutes=59) < snoozed.run_at - before < timedelta(minutes=61)
    assert snoozed.due_at == snoozed.run_at  # not owed before the time it asked for
    retried = load(kit, limited.id)
    assert retried.status is JobStatus.PENDING and retried.attempts == 1
    assert timedelta(seconds=115) < retried.run_at - before < timedelta(seconds=125)
    assert "the API said 429" in (retried.last_error or "")


def test_unknown_handler_stays_pending_and_counts_in_health(
    make_kit: MakeKit, now: datetime
) -> None:
    kit = make_kit()
    # A newer release of the web app wrote a job this worker has no handler for.
    store = kit.defer.store
    with store.begin() as conn:
        ghost = store.insert(
            conn, NewJob(name="ghost", payload={}, run_at=now, max_attempts=3), now=now,
            replace=False,
        )

    summary = burst(kit, at=now)

    assert summary.unknown == 1
    job = load(kit, ghost.id)
    assert job.status is JobStatus.PENDING and job.attempts == 0
    assert job.run_at == now + timedelta(seconds=30)  # DEFER_UNKNOWN_BACKOFF
    assert job.due_at == now  # still owed: the backlog age keeps growing
    assert "no handler registered" in (job.last_error or "")
    assert kit.defer.health(now=now).unknown_handlers == 1
    # The new web release knows the name, and its health still shows the worker's gap.
    web = make_kit()
    web.defer.job("ghost")(lambda job: None)
    assert web.defer.health(now=now).unknown_handlers == 1


def acknowledgements_raising_once_after_commit(
    store: Any, monkeypatch: pytest.MonkeyPatch, error: type[DBAPIError]
) -> list[int]:
    """The store's batch acknowledgement commits as ever; the first one then raises
    *error*, as a lost reply or a refusal after the statement would. Returns how many
    rows that first one owned (empty until it ran)."""
    real = store.acknowledge_many
    raised: list[int] = []

    def acknowledge_then_raise(acks: Any, **options: Any) -> set[int]:
        owned: set[int] = real(acks, **options)
        if not raised:
            raised.append(len(owned))
            raise error("the acknowledgement", {}, Exception("lost, or refused"))
        return owned

    monkeypatch.setattr(store, "acknowledge_many", acknowledge_then_raise)
    return raised


def _claims_losing_the_first_reply(
    store: Any, monkeypatch: pytest.MonkeyPatch, then: Callable[[], None] = lambda: None
) -> list[Job]:
    """The store's claim commits as ever; the first one that takes jobs then raises as
    a connection lost before the reply would (after *then*). Returns what it took."""
    real = store.claim
    lost: list[Job] = []

    def claim(**options: Any) -> list[Job]:
        claimed: list[Job] = real(**options)
        if claimed and not lost:
            lost.extend(claimed)
            then()
            reason = Exception("server closed the connection unexpectedly")
            raise OperationalError("the claim", {}, reason)
        return claimed

    monkeypatch.setattr(store, "claim", claim)
    return lost


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_claim_that_raised_with_a_row_spoilt_since_is_not_adopted_and_the_worker_goes_on(
    make_kit: MakeKit, now: datetime, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """Adopting reads the claim's rows again; one that cannot be read (SQLite text
    spoilt by hand, here between the claim and its adoption) made the adoption raise
    a ValueError at every round, which ended the worker's loop. The adoption is given
    up instead, logged: those jobs come back when their leases lapse."""
    kit = make_kit()
    kit.defer.job("note")(lambda job: None)
    jobs = [kit.defer.schedule("note", {"n": n}, run_at=now) for n in range(2)]
    kit.db.session.commit()
    store = kit.defer.store

    def spoil() -> None:
        with store.begin() as conn:
            conn.exec_driver_sql(
                f"UPDATE {store.table.name} SET payload = '{{x' WHERE id = {jobs[0].id}"
            )

    lost = _claims_losing_the_first_reply(store, monkeypatch, then=spoil)

    with caplog.at_level(logging.ERROR, logger="flask_defer.worker"):
        summary = burst(kit, at=now)

    assert len(lost) == 2 and summary.ran == 0
    assert "could not adopt the jobs of a claim that raised" in caplog.text
    with store.engine.connect() as conn:
        rows = conn.execute(select(store.table.c.status, store.table.c.claim_token)).all()
    assert [status for status, _ in rows] == ["running", "running"]  # until their leases


@pytest.mark.parametrize("kind", ["plain", "keyed", "coroutine"])
def test_a_claim_that_raised_after_its_commit_has_its_jobs_adopted_and_run_once(
    make_kit: MakeKit, now: datetime, monkeypatch: pytest.MonkeyPatch, caplog: Any, kind: str
) -> None:
    """Guarantees, "attempts count handler starts": the worker's next round finds the
    jobs by the claim's token and starts them, their one attempt counted once; keyed
    jobs (claimed in a transaction of their own on PostgreSQL) and coroutine handlers
    alike."""
    kit = make_kit()
    ran: list[tuple[int, int]] = []

    if kind == "coroutine":

        @kit.defer.job("note")
        async def note_async(job: Job) -> None:
            ran.append((job.id, job.attempts))

    else:

        @kit.defer.job("note")
        def note(job: Job) -> None:
            ran.append((job.id, job.attempts))

    keyed = {"concurrency_key": "tenant:1", "concurrency_limit": 3} if kind == "keyed" else {}
    jobs = [kit.defer.schedule("note", {"n": n}, run_at=now, **keyed) for n in range(3)]
    kit.db.session.commit()
    lost = _claims_losing_the_first_reply(kit.defer.store, monkeypatch)

    with caplog.at_level(logging.WARNING, logger="flask_defer.worker"):
        summary = burst(kit, at=now)

    assert len(lost) == 3
    assert sorted(ran) == sorted((job.id, 1) for job in jobs)
    assert summary.done == 3
    for job in jobs:
        settled = load(kit, job.id)
        assert settled.status is JobStatus.DONE and settled.attempts == 1
    assert "3 job(s) adopted by its token" in caplog.text


def test_a_worker_stopped_after_a_claim_raised_gives_the_claims_jobs_back_unspent(
    make_kit: MakeKit, now: datetime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped before a round could adopt them, the worker releases those jobs as it
    releases claimed jobs no thread took: pending, their attempt given back."""
    kit = make_kit()
    ran: list[int] = []

    @kit.defer.job("note")
    def note(job: Job) -> None:
        ran.append(job.id)

    jobs = [kit.defer.schedule("note", {"n": n}, run_at=now) for n in range(3)]
    kit.db.session.commit()
    worker = kit.defer.worker(burst=True, clock=lambda: now)
    lost = _claims_losing_the_first_reply(kit.defer.store, monkeypatch, then=worker.stop)

    worker.run(install_signal_handlers=False)

    assert len(lost) == 3 and ran == []
    for job in jobs:
        released = load(kit, job.id)
        assert released.status is JobStatus.PENDING
        assert released.attempts == 0 and released.claim_token is None
        assert [event.event for event in kit.defer.history(job.id)] == ["scheduled"]


def test_run_due_whose_claim_raised_after_its_commit_keeps_no_token(
    make_kit: MakeKit, now: datetime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_due`` has no next round to adopt in, and its runner lives as long as the
    app: a claim's error ends the call and leaves nothing behind in the runner."""
    kit = make_kit()

    @kit.defer.job("note")
    def note(job: Job) -> None:
        pass

    jobs = [kit.defer.schedule("note", {"n": n}, run_at=now) for n in range(2)]
    kit.db.session.commit()
    lost = _claims_losing_the_first_reply(kit.defer.store, monkeypatch)

    with pytest.raises(OperationalError):
        kit.defer.run_due(now=now)

    assert len(lost) == 2
    assert kit.app.extensions["defer"].runner._unanswered == []
    assert {load(kit, job.id).status for job in jobs} == {JobStatus.RUNNING}


@pytest.mark.parametrize("history", [True, False], ids=["history", "no_history"])
@pytest.mark.parametrize("error", [OperationalError, IntegrityError])
def test_a_batch_of_outcomes_that_raised_after_its_commit_is_not_reported_lost(
    make_kit: MakeKit,
    now: datetime,
    monkeypatch: pytest.MonkeyPatch,
    caplog: Any,
    error: type[DBAPIError],
    history: bool,
) -> None:
    """The flusher writes again a batch whose write raised: retried whole after a
    database-state error, one by one after a refusal (on PostgreSQL a refusal can
    come after the batch statement committed, releasing children). When that write
    had committed, the compare-and-set finds the rows settled; the worker's own
    history events say they were its own (without the history, the rows as the acks
    left them): done, signalled once each, not lost."""
    kit = make_kit(DEFER_HISTORY=history)
    kit.defer.job("note")(lambda job: None)
    jobs = [kit.defer.schedule("note", {"n": n}, run_at=now) for n in range(3)]
    kit.db.session.commit()
    raised = acknowledgements_raising_once_after_commit(kit.defer.store, monkeypatch, error)
    succeeded: list[int] = []
    with (
        signals.job_succeeded.connected_to(
            lambda sender, **data: succeeded.append(data["job"].id), sender=kit.app
        ),
        caplog.at_level(logging.INFO, logger="flask_defer"),
    ):
        summary = burst(kit, at=now)

    assert raised and raised[0] >= 1  # the first write committed outcomes, then raised
    assert summary.done == 3 and summary.lost == 0
    assert sorted(succeeded) == sorted(job.id for job in jobs)
    assert "lease lapsed before acknowledgement" not in caplog.text
    for job in jobs:
        assert load(kit, job.id).status is JobStatus.DONE
        if history:
            events = [event.event for event in kit.defer.history(job.id)]
            assert events.count("done") == 1, events


def test_an_error_waking_other_workers_after_a_keyed_outcome_does_not_write_it_again(
    make_kit: MakeKit, now: datetime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keyed job's written outcome wakes the other workers; that wake failing must
    not send the written, settled batch back to be written and signalled again."""
    kit = make_kit()
    kit.defer.job("note")(lambda job: None)
    jobs = [
        kit.defer.schedule("note", run_at=now, concurrency_key="k", concurrency_limit=2)
        for _ in range(2)
    ]
    kit.db.session.commit()

    def wake_fails(queues: Any) -> None:
        raise OperationalError("NOTIFY", {}, Exception("connection lost"))

    monkeypatch.setattr(kit.defer.store, "wake_workers", wake_fails)
    succeeded: list[int] = []
    with signals.job_succeeded.connected_to(
        lambda sender, **data: succeeded.append(data["job"].id), sender=kit.app
    ):
        summary = burst(kit, at=now)

    assert summary.done == 2 and summary.lost == 0
    assert sorted(succeeded) == sorted(job.id for job in jobs)


@pytest.mark.parametrize("history", [True, False], ids=["history", "no_history"])
def test_a_retried_batch_whose_first_write_never_committed_still_reports_a_taken_job_lost(
    make_kit: MakeKit, now: datetime, monkeypatch: pytest.MonkeyPatch, history: bool
) -> None:
    """No false "written": a write that raised before it committed, then found the rows
    taken over by another claim, leaves no event of this worker's (and rows that hold
    the other claim's token), so lost it is."""
    kit = make_kit(DEFER_HISTORY=history)
    kit.defer.job("note")(lambda job: None)
    jobs = [kit.defer.schedule("note", {"n": n}, run_at=now) for n in range(2)]
    kit.db.session.commit()
    store = kit.defer.store
    real = store.acknowledge_many
    raised: list[bool] = []

    def fail_before_writing(acks: Any, **options: Any) -> set[int]:
        if not raised:
            raised.append(True)
            with store.begin() as conn:  # meanwhile another worker took them over
                conn.execute(update(store.table).values(claim_token="theirs"))
            raise OperationalError("the acknowledgement", {}, Exception("connection lost"))
        owned: set[int] = real(acks, **options)
        return owned

    monkeypatch.setattr(store, "acknowledge_many", fail_before_writing)
    summary = burst(kit, at=now)

    assert raised and summary.lost == 2 and summary.done == 0
    for job in jobs:
        kept = load(kit, job.id)
        assert kept.status is JobStatus.RUNNING and kept.claim_token == "theirs"


# -- atomic handlers -----------------------------------------------------------------


def _note_model(kit: AppKit) -> Any:
    class Note(kit.db.Model):  # type: ignore[name-defined]
        __tablename__ = "notes"
        id: Mapped[int] = mapped_column(Integer, primary_key=True)
        text: Mapped[str] = mapped_column(String(50))

    kit.db.create_all()
    return Note


def test_atomic_handler_commits_with_the_done_mark_and_a_raise_rolls_back_both(
    make_kit: MakeKit, now: datetime
) -> None:
    kit = make_kit()
    Note = _note_model(kit)

    @kit.defer.job("write_note", atomic=True, max_attempts=2)
    def write_note(job: Job) -> None:
        kit.db.session.add(Note(text=job.payload["text"]))
        if job.payload.get("fail"):
            raise RuntimeError("boom after writing")

    kept = kit.defer.schedule("write_note", {"text": "kept"}, run_at=now)
    lost = kit.defer.schedule("write_note", {"text": "lost", "fail": True}, run_at=now)
    kit.db.session.commit()

    summary = burst(kit, at=now)

    assert summary.done == 1 and summary.retried == 1
    assert kit.db.session.scalars(select(Note.text)).all() == ["kept"]
    assert load(kit, kept.id).status is JobStatus.DONE
    failed = load(kit, lost.id)
    assert failed.status is JobStatus.PENDING and failed.attempts == 1
    assert "boom after writing" in (failed.last_error or "")


def test_atomic_handler_that_lost_its_claim_writes_nothing(
    make_kit: MakeKit, now: datetime
) -> None:
    kit = make_kit()
    Note = _note_model(kit)
    store = kit.defer.store

    @kit.defer.job("write_note", atomic=True)
    def write_note(job: Job) -> None:
        # Meanwhile the lease lapsed and another worker claimed the job.
        with store.begin() as conn:
            conn.execute(
                update(store.table)
                .where(store.table.c.id == job.id)
                .values(claim_token="another-worker")
            )
        kit.db.session.add(Note(text="from the stale claim"))

    job = kit.defer.schedule("write_note", run_at=now)
    kit.db.session.commit()

    assert burst(kit, at=now).lost == 1

    assert kit.db.session.scalars(select(Note.text)).all() == []
    assert load(kit, job.id).claim_token == "another-worker"


# -- signals and logging ---------------------------------------------------------------


def test_all_five_signals_fire(make_kit: MakeKit, now: datetime) -> None:
    kit = make_kit()
    kit.defer.job("works")(lambda job: None)

    @kit.defer.job("breaks", max_attempts=1)
    def breaks(job: Job) -> None:
        raise ValueError("broken")

    seen: list[tuple[str, int, Any]] = []
    lock = threading.Lock()

    def recorder(name: str) -> Callable[..., None]:
        def receive(sender: Any, **data: Any) -> None:
            with lock:
                seen.append((name, data["job"].id, data.get("will_retry")))
            assert sender is kit.app

        return receive

    with ExitStack() as stack:
        for name in ("scheduled", "started", "succeeded", "failed", "cancelled"):
            signal = getattr(signals, f"job_{name}")
            stack.enter_context(signal.connected_to(recorder(name), sender=kit.app))
        works = kit.defer.schedule("works", run_at=now)
        breaking = kit.defer.schedule("breaks", run_at=now)
        dropped = kit.defer.schedule("works", run_at=now + timedelta(hours=1))
        kit.db.session.commit()
        assert kit.defer.cancel(dropped.id)
        burst(kit, at=now)

    assert sorted(seen) == sorted(
        [
            ("scheduled", works.id, None),
            ("scheduled", breaking.id, None),
            ("scheduled", dropped.id, None),
            ("cancelled", dropped.id, None),
            ("started", works.id, None),
            ("started", breaking.id, None),
            ("succeeded", works.id, None),
            ("failed", breaking.id, False),
        ]
    )


def test_every_job_log_line_names_the_job(
    make_kit: MakeKit, now: datetime, caplog: pytest.LogCaptureFixture
) -> None:
    kit = make_kit()
    kit.defer.job("works")(lambda job: None)
    job = kit.defer.schedule("works", key="invoice:7", run_at=now)
    kit.db.session.commit()

    with caplog.at_level(logging.DEBUG, logger="flask_defer"):
        burst(kit, at=now)

    job_lines = [r for r in caplog.records if r.name == "flask_defer"]
    assert job_lines, "the executor logged nothing"
    for record in job_lines:
        assert (record.job_id, record.job_name, record.job_key) == (job.id, "works", "invoice:7")
        line = json.loads(JsonFormatter().format(record))
        assert line["job_id"] == job.id and line["job_key"] == "invoice:7"
        assert f"job {job.id} works key=invoice:7" in line["message"]


# -- wall-clock behaviour: timeouts, leases, wake-ups, shutdown ------------------------


def test_long_jobs_on_most_threads_do_not_keep_a_due_job_from_an_idle_one(
    make_kit: MakeKit,
) -> None:
    # The first claim fills all four threads (a "backlog"); three of its jobs run on.
    # The thread the fourth frees must still take a job that comes due, not wait for
    # half the pool to be free.
    kit = make_kit(DEFER_RECLAIM_INTERVAL=30, DEFER_MAX_SLEEP=30)
    go = threading.Event()
    ran: list[str] = []

    @kit.defer.job("long")
    def long(job: Job) -> None:
        go.wait(30)

    @kit.defer.job("short")
    def short(job: Job) -> None:
        ran.append(job.payload["n"])

    for _ in range(3):
        kit.defer.schedule("long")
    kit.defer.schedule("short", {"n": "first"})
    kit.db.session.commit()
    worker = kit.defer.worker(concurrency=4)
    try:
        with worker_thread(worker):
            wait_until(lambda: ran == ["first"], timeout=10)
            kit.defer.schedule("short", {"n": "later"})
            kit.db.session.commit()
            wait_until(lambda: ran == ["first", "later"], timeout=5)
            go.set()
    finally:
        go.set()


@pytest.mark.parametrize("backend", ["postgresql"])  # the wake is a NOTIFY
@pytest.mark.parametrize("handed_back_by", ["reclaim", "release"])
def test_a_job_handed_back_elsewhere_wakes_the_workers_of_its_own_queue(
    make_kit: MakeKit, handed_back_by: str
) -> None:
    # A worker of another queue than "default", with polls, sleeps and maintenance
    # rounds far longer than the test: only the NOTIFY of the job's own queue wakes it.
    kit = make_kit(**ONLY_WAKE_UPS)
    ran: list[int] = []
    kit.defer.job("send", queue="mail")(lambda job: ran.append(job.id))
    store = kit.defer.store
    with worker_thread(kit.defer.worker(queues=["mail"])):
        wait_until(lambda: kit.defer.workers() != [], timeout=10)
        time.sleep(0.3)  # past the worker's first maintenance round and claim
        # Due in an hour (no NOTIFY, nothing the worker waits for), claimed elsewhere.
        job = kit.defer.schedule("send", delay=timedelta(hours=1))
        kit.db.session.commit()
        now = utcnow()
        later, lapsed = now + timedelta(hours=2), now - timedelta(seconds=1)
        [held] = store.claim(now=later, limit=1, token="gone", lease_until=lapsed)
        if handed_back_by == "reclaim":
            assert store.reclaim_lapsed(now=utcnow()) == (1, 0)
        else:
            assert store.release([held], now=utcnow()) == 1
        wait_until(lambda: ran == [job.id], timeout=10)


@pytest.mark.parametrize("answer", ["retry", "snooze"])
def test_a_worker_starts_a_retry_or_snooze_at_its_run_at_not_at_its_next_poll(
    make_kit: MakeKit, answer: str
) -> None:
    # Polls, idle sleeps and maintenance rounds far longer than the retry's delay: only
    # the wake the outcome's write brings makes the loop look at its new run_at (the
    # loop's last look saw the job running).
    kit = make_kit(**ONLY_WAKE_UPS)
    starts: list[float] = []

    @kit.defer.job("flaky", max_attempts=3)
    def flaky(job: Job) -> None:
        starts.append(time.monotonic())
        if len(starts) == 1:
            raise RetryAfter(0.3) if answer == "retry" else NotYet(timedelta(seconds=0.3))

    job = kit.defer.schedule("flaky")
    kit.db.session.commit()
    with worker_thread(kit.defer.worker()):
        wait_until(lambda: load(kit, job.id).status is JobStatus.DONE, timeout=40)
    assert len(starts) == 2
    # Within tens of milliseconds of 0.3 s here; a worker that slept until its poll,
    # its longest sleep or its maintenance round would start it 30 s later.
    assert 0.3 <= starts[1] - starts[0] < 3.0, starts


def test_handler_past_its_timeout_fails_the_attempt_without_blocking_the_worker(
    make_kit: MakeKit, caplog: pytest.LogCaptureFixture
) -> None:
    kit = make_kit()
    release = threading.Event()

    @kit.defer.job("stuck", timeout=0.3, max_attempts=2)
    def stuck(job: Job) -> str:
        release.wait(20)
        return "late result"

    kit.defer.job("quick")(lambda job: "quick result")
    stuck_job = kit.defer.schedule("stuck")
    kit.db.session.commit()

    with caplog.at_level(logging.INFO, logger="flask_defer"), worker_thread(
        kit.defer.worker(concurrency=1)
    ) as worker:
        timed_out = wait_until(
            lambda: (job := load(kit, stuck_job.id)).last_error and job
        )
        assert timed_out.status is JobStatus.PENDING and timed_out.attempts == 1
        assert "timeout of 0.3 s" in (timed_out.last_error or "")
        # The only thread is still stuck in the handler, yet the next job runs.
        quick = kit.defer.schedule("quick")
        kit.db.session.commit()
        wait_until(lambda: load(kit, quick.id).status is JobStatus.DONE)
        assert worker.pool.abandoned_threads == 1
        release.set()
        wait_until(lambda: any("outcome discarded" in r.getMessage() for r in caplog.records))
    wait_for_handler_threads()

    after = load(kit, stuck_job.id)  # the late return changed nothing
    assert after.status is JobStatus.PENDING and after.result is None
    assert after.attempts == 1 and after.last_error == timed_out.last_error


def test_timeout_on_the_last_attempt_fails_the_job(make_kit: MakeKit) -> None:
    kit = make_kit(DEFER_JOB_TIMEOUT=0.2)  # the app-wide default applies
    release = threading.Event()

    @kit.defer.job("stuck", max_attempts=1)
    def stuck(job: Job) -> None:
        release.wait(20)

    job = kit.defer.schedule("stuck")
    kit.db.session.commit()
    try:
        with worker_thread(kit.defer.worker()):
            wait_until(lambda: load(kit, job.id).status is JobStatus.FAILED)
    finally:
        release.set()
        wait_for_handler_threads()
    assert "timeout of 0.2 s" in (load(kit, job.id).last_error or "")


def test_heartbeat_keeps_a_long_job_leased(make_kit: MakeKit) -> None:
    # The handler outlives its lease three times over; only the heartbeat stops the
    # reclaim (every 0.1 s) from handing it to another run. A lease of 1.5 s (a beat
    # every 0.5 s) leaves a busy host a second of slack: with 0.6 s, one renewal
    # delayed past 0.4 s behind other writers' commits lost the lease in a CI run.
    kit = make_kit(DEFER_LEASE=1.5)
    runs: list[int] = []

    @kit.defer.job("long")
    def long(job: Job) -> None:
        runs.append(job.attempts)
        time.sleep(4.5)

    job = kit.defer.schedule("long")
    kit.db.session.commit()
    with worker_thread(kit.defer.worker(concurrency=2)) as worker:
        first = wait_until(lambda: (j := load(kit, job.id)).lease_expires_at and j)
        wait_until(lambda: load(kit, job.id).status is JobStatus.DONE, timeout=20)
        assert worker._heartbeat.beats >= 2

    assert runs == [1]
    assert first.lease_expires_at is not None


def test_lapsed_lease_is_reclaimed_and_the_stale_acknowledgement_refused(
    make_kit: MakeKit,
) -> None:
    kit = make_kit()
    kit.defer.job("work")(lambda job: "second run")
    store = kit.defer.store
    job = kit.defer.schedule("work")
    kit.db.session.commit()
    # A worker claimed it and died: its lease ran out a second ago.
    now = utcnow()
    [stale] = store.claim(
        now=now, limit=1, token=uuid.uuid4().hex, lease_until=now - timedelta(seconds=1)
    )

    summary = burst(kit)

    assert summary.done == 1
    done = load(kit, job.id)
    assert done.status is JobStatus.DONE and done.attempts == 2 and done.result == "second run"
    assert not store.ack_done(stale, now=utcnow(), result="from the dead")
    assert load(kit, job.id) == done


def test_worker_wakes_at_run_at_not_at_its_next_timed_wake(make_kit: MakeKit) -> None:
    # Sleep bounds of 30 s everywhere: only "sleep until the next run_at" can start
    # the job about a second from now.
    kit = make_kit(**ONLY_WAKE_UPS)
    started: list[datetime] = []
    kit.defer.job("on_time")(lambda job: started.append(utcnow()))
    job = kit.defer.schedule("on_time", delay=1.0)
    kit.db.session.commit()

    with worker_thread(kit.defer.worker()):
        wait_until(lambda: started, timeout=10)

    lateness = (started[0] - job.run_at).total_seconds()
    assert 0 <= lateness < 5


def test_new_job_wakes_an_idle_worker_long_before_its_timed_wake(
    make_kit: MakeKit, backend: str
) -> None:
    # PostgreSQL: the NOTIFY sent with the insert wakes the worker. SQLite cannot
    # notify, so its short poll finds the job.
    kit = make_kit(
        DEFER_MAX_SLEEP=30,
        DEFER_POLL_INTERVAL=30 if backend == "postgresql" else 0.2,
        DEFER_RECLAIM_INTERVAL=30,
    )
    ran = threading.Event()
    kit.defer.job("now")(lambda job: ran.set())

    with worker_thread(kit.defer.worker()) as worker:
        if backend == "postgresql":
            wait_until(lambda: worker.waker.listening)
        time.sleep(0.3)  # let it settle into its 30 s sleep
        kit.defer.schedule("now")
        kit.db.session.commit()
        started = time.monotonic()
        assert ran.wait(10)
        assert time.monotonic() - started < 5
        if backend == "postgresql":
            assert worker.waker.notifications >= 1


def test_stop_lets_a_running_handler_finish_within_the_grace(make_kit: MakeKit) -> None:
    kit = make_kit(DEFER_SHUTDOWN_GRACE=10)
    entered = threading.Event()

    @kit.defer.job("short")
    def short(job: Job) -> str:
        entered.set()
        time.sleep(0.5)
        return "finished"

    job = kit.defer.schedule("short")
    kit.db.session.commit()
    with worker_thread(kit.defer.worker()):
        assert entered.wait(10)
    done = load(kit, job.id)
    assert done.status is JobStatus.DONE and done.result == "finished"


def test_a_worker_claims_only_one_job_per_idle_thread_and_stops_without_touching_the_rest(
    make_kit: MakeKit,
) -> None:
    kit = make_kit(DEFER_SHUTDOWN_GRACE=10, DEFER_CLAIM_BATCH=5)
    entered, go = threading.Event(), threading.Event()

    @kit.defer.job("held")
    def held(job: Job) -> None:
        entered.set()
        go.wait(10)

    jobs = [kit.defer.schedule("held", {"n": n}) for n in range(5)]
    kit.db.session.commit()
    worker = kit.defer.worker(concurrency=1)
    with worker_thread(worker):
        assert entered.wait(10)
        time.sleep(0.2)  # time for a wrong worker to claim more
        assert len(worker.pool.in_flight()) == 1
        claimed = [load(kit, job.id) for job in jobs]
        assert sorted(job.status.value for job in claimed) == ["pending"] * 4 + ["running"]
        worker.stop()
        go.set()
    after = [load(kit, job.id) for job in jobs]
    assert sorted(job.status.value for job in after) == ["done"] + ["pending"] * 4
    assert all(job.attempts == 0 for job in after if job.status is JobStatus.PENDING)


def test_stop_releases_a_handler_still_running_after_the_grace(make_kit: MakeKit) -> None:
    kit = make_kit(DEFER_SHUTDOWN_GRACE=0.3)
    entered, release = threading.Event(), threading.Event()

    @kit.defer.job("long")
    def long(job: Job) -> str:
        entered.set()
        release.wait(20)
        return "too late"

    job = kit.defer.schedule("long")
    kit.db.session.commit()
    try:
        with worker_thread(kit.defer.worker()):
            assert entered.wait(10)
        released = load(kit, job.id)
        assert released.status is JobStatus.PENDING
        assert released.attempts == 0 and released.claim_token is None
    finally:
        release.set()
        wait_for_handler_threads()


# -- retention, retry and the CLI --------------------------------------------------------


def test_worker_prunes_settled_rows_past_their_retention(
    make_kit: MakeKit, now: datetime
) -> None:
    kit = make_kit()
    kit.defer.job("works")(lambda job: None)

    @kit.defer.job("breaks", max_attempts=1)
    def breaks(job: Job) -> None:
        raise ValueError("no")

    done = kit.defer.schedule("works", run_at=now)
    failed = kit.defer.schedule("breaks", run_at=now)
    kit.db.session.commit()
    burst(kit, at=now)
    assert load(kit, failed.id).status is JobStatus.FAILED

    burst(kit, at=now + timedelta(days=8))  # done kept 7 days, failed 30

    with kit.defer.store.begin() as conn:
        assert kit.defer.store.get(conn, job_id=done.id) is None
    assert load(kit, failed.id).status is JobStatus.FAILED
    assert kit.defer.prune(now=now + timedelta(days=31)) == 1


def test_cli_prune_retry_and_burst_worker(make_kit: MakeKit, now: datetime) -> None:
    kit = make_kit(DEFER_RETENTION=0)
    attempts: list[int] = []

    @kit.defer.job("flaky", max_attempts=1)
    def flaky(job: Job) -> None:
        attempts.append(job.attempts)
        if len(attempts) == 1:
            raise ValueError("first time fails")

    job = kit.defer.schedule("flaky")
    kit.db.session.commit()
    runner = kit.app.test_cli_runner()

    result = runner.invoke(args=["defer", "worker", "--burst", "--concurrency", "2"])
    assert result.exit_code == 0, result.output
    assert load(kit, job.id).status is JobStatus.FAILED

    result = runner.invoke(args=["defer", "retry", str(job.id)])
    assert result.exit_code == 0 and f"job {job.id} is pending again" in result.output
    result = runner.invoke(args=["defer", "retry", str(job.id)])
    assert result.exit_code == 1 and "pending" in result.output

    result = runner.invoke(args=["defer", "worker", "--burst"])
    assert result.exit_code == 0, result.output
    assert load(kit, job.id).status is JobStatus.DONE and attempts == [1, 1]

    result = runner.invoke(args=["defer", "prune"])
    assert result.exit_code == 0 and "pruned 1 settled job(s)" in result.output


def test_worker_command_keeps_startup_objects_out_of_full_collections(
    make_kit: MakeKit,
) -> None:
    """``flask defer worker`` freezes what start-up made (a full collection over it paused
    every thread for tens of milliseconds) while it runs, and hands it back after;
    ``Worker.run`` from the app's own code leaves the collector alone."""
    kit = make_kit()
    frozen_while_running: list[int] = []

    @kit.defer.job("frozen")
    def frozen(job: Job) -> None:
        frozen_while_running.append(gc.get_freeze_count())

    assert gc.get_freeze_count() == 0
    kit.defer.schedule("frozen")
    kit.db.session.commit()
    result = kit.app.test_cli_runner().invoke(args=["defer", "worker", "--burst"])
    assert result.exit_code == 0, result.output
    assert frozen_while_running and frozen_while_running[0] > 10_000
    assert gc.get_freeze_count() == 0

    kit.defer.schedule("frozen")
    kit.db.session.commit()
    burst(kit)
    assert frozen_while_running[1:] == [0]


def test_worker_command_leaves_a_process_that_froze_its_own_objects_alone(
    make_kit: MakeKit,
) -> None:
    kit = make_kit()
    kit.defer.job("noop")(lambda job: None)
    kit.defer.schedule("noop")
    kit.db.session.commit()
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        result = kit.app.test_cli_runner().invoke(args=["defer", "worker", "--burst"])
        assert result.exit_code == 0, result.output
        # Still frozen: objects freed by their reference count leave the permanent
        # generation meanwhile, but handing it back to the collector would empty it.
        assert gc.get_freeze_count() > before // 2
    finally:
        gc.unfreeze()


# -- configuration ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("DEFER_WORKER_CONCURRENCY", 0),
        ("DEFER_WORKER_CONCURRENCY", True),
        ("DEFER_POLL_INTERVAL", 0),
        ("DEFER_LEASE", 0),
        ("DEFER_JOB_TIMEOUT", -1),
        ("DEFER_EMBEDDED_WORKER", "yes"),
    ],
)
def test_bad_worker_settings_name_the_key(
    make_app: Callable[..., AppKit], key: str, value: Any
) -> None:
    with pytest.raises(InvalidArgument, match=key):
        make_app(**{key: value})


def test_bad_worker_arguments_name_the_argument(make_kit: MakeKit) -> None:
    kit = make_kit()
    with pytest.raises(InvalidArgument, match="concurrency"):
        kit.defer.worker(concurrency=0)
    with pytest.raises(InvalidArgument, match="queues"):
        kit.defer.worker(queues="mail")


def test_a_worker_killed_with_busy_threads_has_spent_only_their_attempts(
    make_kit: MakeKit,
) -> None:
    # What a worker killed mid-run leaves behind: the jobs its threads had carry their
    # attempt (counted by the claim), the rest were never claimed.
    kit = make_kit(DEFER_CLAIM_BATCH=5)
    entered, go = threading.Event(), threading.Event()
    ran: list[int] = []

    @kit.defer.job("held")
    def held(job: Job) -> None:
        ran.append(job.payload["n"])
        entered.set()
        go.wait(10)

    jobs = [kit.defer.schedule("held", {"n": n}) for n in range(5)]
    kit.db.session.commit()
    worker = kit.defer.worker(concurrency=1)
    with worker_thread(worker):
        assert entered.wait(10)
        claimed = [load(kit, job.id) for job in jobs]
        assert sorted(job.attempts for job in claimed) == [0, 0, 0, 0, 1]
        # The worker "dies": its lease lapses and another worker's reclaim runs.
        returned, failed = kit.defer.store.reclaim_lapsed(now=utcnow() + timedelta(hours=1))
        assert (returned, failed) == (1, 0)
        worker.stop()
        go.set()
    after = [load(kit, job.id) for job in jobs]
    started = next(job for job in after if job.payload["n"] == ran[0])
    assert started.attempts == 1
    others = [j for j in after if j is not started]
    assert all(j.status is JobStatus.PENDING and j.attempts == 0 for j in others)


def test_every_job_runs_with_the_attempt_its_claim_counted(make_kit: MakeKit) -> None:
    kit = make_kit(DEFER_CLAIM_BATCH=3)
    seen: list[int] = []

    @kit.defer.job("count")
    def count(job: Job) -> None:
        seen.append(job.attempts)
        time.sleep(0.05)

    jobs = [kit.defer.schedule("count") for _ in range(4)]
    kit.db.session.commit()
    summary = burst(kit, concurrency=1)
    assert summary.done == 4
    assert seen == [1, 1, 1, 1]
    assert all(load(kit, job.id).attempts == 1 for job in jobs)


# -- recurring schedules ----------------------------------------------------------------


def test_worker_wakes_for_a_tick_due_before_any_job(make_kit: MakeKit) -> None:
    # Polls, idle sleeps and maintenance rounds far longer than the interval: only a
    # wake-up that knows the next tick starts each tick on time.
    kit = make_kit(DEFER_POLL_INTERVAL=5, DEFER_MAX_SLEEP=30, DEFER_RECLAIM_INTERVAL=30)
    ran: list[tuple[Job, datetime]] = []

    @kit.defer.job("tick")
    def tick(job: Job) -> None:
        ran.append((job, utcnow()))

    kit.defer.schedule("tick", delay=timedelta(hours=1))  # the next job is an hour away
    kit.db.session.commit()
    kit.defer.recurring("every-second", "tick", every=1)
    with worker_thread(kit.defer.worker(concurrency=1)):
        wait_until(lambda: len(ran) >= 3, timeout=10)
    ticks = [(job, at) for job, at in ran if job.key and job.key.startswith("recurring:")]
    assert len(ticks) >= 3
    lateness = [(at - job.run_at).total_seconds() for job, at in ticks]
    # Ticks start within tens of milliseconds here; a worker that slept until its poll
    # (5 s) or its longest sleep (30 s) would start them seconds late. The bound leaves
    # room for a first tick on a loaded machine (0.53 s once in the full suite).
    assert max(lateness) < 2.0, lateness
    assert [job.run_at.microsecond for job, _ in ticks] == [0] * len(ticks)


def test_burst_worker_at_an_injected_time_writes_and_runs_the_due_tick(
    make_kit: MakeKit,
) -> None:
    kit = make_kit()
    ran: list[Job] = []

    @kit.defer.job("tick")
    def tick(job: Job) -> None:
        ran.append(job)

    kit.defer.recurring("hourly", "tick", cron="0 * * * *")
    start = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)
    kit.defer.worker(burst=True, clock=lambda: start).run(install_signal_handlers=False)
    assert ran == []  # synced at start: the first tick is 10:00
    at_ten = datetime(2026, 3, 1, 10, 0, 5, tzinfo=UTC)
    kit.defer.worker(burst=True, clock=lambda: at_ten).run(install_signal_handlers=False)
    wait_for_handler_threads()
    assert [job.key for job in ran] == ["recurring:hourly:2026-03-01T10:00:00Z"]


def test_a_paused_queue_waits_in_a_running_worker_and_runs_within_a_second_of_resume(
    make_kit: MakeKit, backend: str
) -> None:
    # Timed wakes of 30 s on PostgreSQL: only the resume's NOTIFY can wake the worker in
    # time. SQLite cannot notify: a poll finds the jobs (0.2 s, which leaves a loaded
    # machine most of the second).
    kit = make_kit(
        DEFER_MAX_SLEEP=30,
        DEFER_POLL_INTERVAL=30 if backend == "postgresql" else 0.2,
        DEFER_RECLAIM_INTERVAL=30,
    )
    started: dict[str, float] = {}
    entered, release = threading.Event(), threading.Event()

    @kit.defer.job("send_email", queue="emails")
    def send_email(job: Job) -> None:
        started[job.payload["n"]] = time.monotonic()
        if job.payload["n"] == "running":
            entered.set()
            assert release.wait(10)

    kit.defer.job("report")(lambda job: started.setdefault("report", time.monotonic()))
    with worker_thread(kit.defer.worker(concurrency=2)) as worker:
        if backend == "postgresql":
            wait_until(lambda: worker.waker.listening)
        running = kit.defer.schedule("send_email", {"n": "running"})
        kit.db.session.commit()
        assert entered.wait(10)
        assert kit.defer.pause(queue="emails")
        release.set()  # the job that was running when the queue paused finishes
        wait_until(lambda: load(kit, running.id).status is JobStatus.DONE)

        waiting = kit.defer.schedule("send_email", {"n": "waiting"})
        kit.defer.schedule("report")  # due after it, in another queue
        kit.db.session.commit()
        wait_until(lambda: "report" in started)
        time.sleep(0.3)  # time for a claim that ignored the pause to have started it
        assert "waiting" not in started and load(kit, waiting.id).status is JobStatus.PENDING

        assert kit.defer.resume(queue="emails")
        resumed = time.monotonic()
        wait_until(lambda: "waiting" in started, timeout=10)
    assert started["waiting"] - resumed < 1.0
    assert load(kit, waiting.id).due_at == waiting.due_at
