"""An outcome the database refuses for its values holds none of the others back, on
both backends: a worker whose batch of outcomes fails on one job's row (an app's
trigger on the jobs table, a result past the database's size limit) writes the others
one by one. The refused one is dropped, and its job runs again once its lease lapses;
but a result the database will not store fails its job, which would only make the
same result again."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import IntegrityError

from flask_defer import Job, JobStatus
from flask_defer.signals import job_failed, job_succeeded

from ..conftest import AppKit
from ..worker_helpers import wait_until, worker_thread
from .test_worker import MakeKit, acknowledgements_raising_once_after_commit, load, make_kit

__all__ = ["make_kit"]


def refuse_status(kit: AppKit, job_id: int, backend: str, status: str = "done") -> None:
    """An app's trigger (``refuse_<status>``) that refuses to give *job_id* *status*."""
    table = kit.defer.store.table.name
    name = f"refuse_{status}"
    if backend == "sqlite":
        statements = [
            f"CREATE TRIGGER {name} BEFORE UPDATE OF status ON {table}"
            f" WHEN NEW.id = {job_id} AND NEW.status = '{status}'"
            " BEGIN SELECT RAISE(ABORT, 'refused by the app'); END"
        ]
    else:
        statements = [
            f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$"
            f" BEGIN IF NEW.id = {job_id} AND NEW.status = '{status}' THEN"
            " RAISE EXCEPTION 'refused by the app'; END IF; RETURN NEW; END $$",
            f"CREATE TRIGGER {name} BEFORE UPDATE ON {table}"
            f" FOR EACH ROW EXECUTE FUNCTION {name}()",
        ]
    with kit.defer.store.begin() as conn:
        for statement in statements:
            conn.execute(text(statement))


def drop_trigger(kit: AppKit, name: str, backend: str) -> None:
    on_table = "" if backend == "sqlite" else f" ON {kit.defer.store.table.name}"
    with kit.defer.store.begin() as conn:
        conn.execute(text(f"DROP TRIGGER {name}{on_table}"))


@pytest.mark.parametrize("returns", [None, "ok"])
def test_an_outcome_the_database_refuses_holds_none_of_the_others_back(
    make_kit: MakeKit, backend: str, caplog: pytest.LogCaptureFixture, returns: str | None
) -> None:
    """With or without a result: a refusal that is not for the result's size does not
    fail the job, which may well be written next time (here: the trigger is gone)."""
    # Outcomes wait 0.3 s for each other, so the four go in one batch; a lease of
    # 3 s lapses soon after the refused one is dropped, and not before the trigger
    # is gone on a loaded machine (it would run a third time).
    kit = make_kit(DEFER_ACK_FLUSH=0.3, DEFER_LEASE=3)
    ran: list[int] = []
    lock = threading.Lock()

    @kit.defer.job("note")
    def note(job: Job) -> str | None:
        with lock:
            ran.append(job.id)
        return returns

    ids = [kit.defer.schedule("note", {"n": n}).id for n in range(4)]
    kit.db.session.commit()
    refused = ids[1]
    refuse_status(kit, refused, backend)
    caplog.set_level(logging.WARNING, logger="flask_defer")
    with kit.app.app_context():
        worker = kit.defer.worker(concurrency=4)
    with worker_thread(worker):
        others = [i for i in ids if i != refused]
        wait_until(lambda: all(load(kit, i).status is JobStatus.DONE for i in others), timeout=15)
        assert load(kit, refused).status is JobStatus.RUNNING  # its outcome was dropped
        assert f"could not write the outcome of job {refused}" in caplog.text
        assert "refused by the app" in caplog.text
        drop_trigger(kit, "refuse_done", backend)
        # Nothing lost: the lease lapses and the job runs again, written this time.
        wait_until(lambda: load(kit, refused).status is JobStatus.DONE, timeout=15)
    assert sorted(ran) == sorted(ids + [refused])
    assert load(kit, refused).result == returns
    assert "cannot be stored" not in caplog.text


#: The size limit the test gives the database: 1 MB, where PostgreSQL's jsonb stops at
#: 256 MB and SQLite's strings at 1 GB (values a test should not have to build).
LIMIT = 1_000_000


def limit_result_size(kit: AppKit, backend: str) -> None:
    """Make the database refuse a result over :data:`LIMIT` as it refuses one over its
    own limit: SQLite with its length limit lowered (SQLITE_TOOBIG), PostgreSQL with a
    trigger raising the server's own error for it, SQLSTATE 54000 "program limit
    exceeded" (which psycopg raises as OperationalError)."""
    engine = kit.defer.store.engine
    if backend == "sqlite":

        @event.listens_for(engine, "connect")
        def lower_limit(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, LIMIT)

        engine.dispose()  # every connection from now on has the limit
        return
    table = kit.defer.store.table.name
    with kit.defer.store.begin() as conn:
        conn.execute(
            text(
                "CREATE FUNCTION limit_result() RETURNS trigger LANGUAGE plpgsql AS $$"
                f" BEGIN IF octet_length(NEW.result::text) > {LIMIT} THEN"
                " RAISE EXCEPTION 'total size of jsonb object elements exceeds the maximum'"
                " USING ERRCODE = 'program_limit_exceeded'; END IF; RETURN NEW; END $$"
            )
        )
        conn.execute(
            text(
                f"CREATE TRIGGER limit_result BEFORE UPDATE ON {table}"
                " FOR EACH ROW EXECUTE FUNCTION limit_result()"
            )
        )


def test_a_result_past_the_databases_size_limit_fails_its_job_once_and_holds_none_back(
    make_kit: MakeKit, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, PostgreSQL's limit error was retried as if the database were down: the
    batch, and every outcome merged into it, waited until the leases lapsed. Then the
    refused outcome was dropped, so the handler ran again after its lease, made the
    same result, and was refused again, until its attempts ran out ("lease lapsed")."""
    kit = make_kit(DEFER_ACK_FLUSH=0.3, DEFER_LEASE=30)
    runs: list[int] = []
    failed: list[tuple[int, bool, str]] = []

    @kit.defer.job("report")
    def report(job: Job) -> dict[str, str]:
        runs.append(job.id)
        return {"text": "x" * job.payload["size"]}

    def on_failed(_sender: Any, job: Job, error: str, will_retry: bool) -> None:
        failed.append((job.id, will_retry, error))

    sizes = [10, 2 * LIMIT, 10, 10]
    ids = [kit.defer.schedule("report", {"size": size}).id for size in sizes]
    kit.db.session.commit()
    too_big = ids[1]
    limit_result_size(kit, backend)
    caplog.set_level(logging.WARNING, logger="flask_defer")
    with kit.app.app_context():
        worker = kit.defer.worker(concurrency=4)
    with job_failed.connected_to(on_failed), worker_thread(worker):
        others = [i for i in ids if i != too_big]
        # Well inside the 30 s lease: only writing them apart from the big one does it.
        wait_until(lambda: all(load(kit, i).status is JobStatus.DONE for i in others), timeout=15)
        wait_until(lambda: load(kit, too_big).status is JobStatus.FAILED, timeout=15)
    assert "retrying in" not in caplog.text  # never taken for the database's state
    assert [load(kit, i).result for i in others] == [{"text": "x" * 10}] * 3
    big = load(kit, too_big)
    assert big.result is None and big.attempts == 1
    assert "the handler's result cannot be stored: the database refused it (" in (
        big.last_error or ""
    )
    assert sorted(runs) == sorted(ids)  # each ran once: the big one is not run again
    assert [(job_id, retry) for job_id, retry, _ in failed] == [(too_big, False)]
    assert f"could not write the outcome of job {too_big}" not in caplog.text
    assert caplog.text.count("failed without retry") == 1
    events = [event.event for event in kit.defer.history(too_big)]
    assert events == ["scheduled", "started", "failed"]


def test_a_result_refused_with_its_failure_too_is_dropped_and_runs_again(
    make_kit: MakeKit, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """When the database refuses the failure that stands in for a refused result too
    (an app's trigger on failures), that outcome is dropped as any other, unlogged as
    a failure, and the job runs again after its lease: its failure is written then."""
    kit = make_kit(DEFER_ACK_FLUSH=0.3, DEFER_LEASE=3)  # outlives the trigger's drop
    runs: list[int] = []

    @kit.defer.job("report")
    def report(job: Job) -> dict[str, str]:
        runs.append(job.id)
        return {"text": "x" * job.payload["size"]}

    big = kit.defer.schedule("report", {"size": 2 * LIMIT}).id
    kit.db.session.commit()
    limit_result_size(kit, backend)
    refuse_status(kit, big, backend, "failed")
    caplog.set_level(logging.WARNING, logger="flask_defer")
    with kit.app.app_context():
        worker = kit.defer.worker(concurrency=2)
    with worker_thread(worker):
        wait_until(lambda: f"could not write the outcome of job {big}" in caplog.text)
        assert "refused by the app" in caplog.text  # the stand-in failure was tried
        assert "failed without retry" not in caplog.text  # and not logged, unwritten
        assert load(kit, big).status is JobStatus.RUNNING
        drop_trigger(kit, "refuse_failed", backend)
        wait_until(lambda: load(kit, big).status is JobStatus.FAILED, timeout=15)
    assert runs == [big, big]
    assert "the database refused it (" in (load(kit, big).last_error or "")
    assert caplog.text.count("failed without retry") == 1


def test_run_due_writes_a_refused_batch_one_by_one_as_the_worker_does(
    make_kit: MakeKit, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``run_due`` raised the database's refusal of a batch, and every outcome of it
    was lost (those jobs ran again after their leases). Now, as in the worker: the
    others are written, a result past the size limit fails its job once, and an
    outcome refused otherwise (an app's trigger) is dropped and runs again later."""
    kit = make_kit()

    @kit.defer.job("report")
    def report(job: Job) -> dict[str, str]:
        return {"text": "x" * job.payload["size"]}

    sizes = [10, 2 * LIMIT, 10, 10]
    ids = [kit.defer.schedule("report", {"size": size}).id for size in sizes]
    kit.db.session.commit()
    too_big, refused = ids[1], ids[2]
    limit_result_size(kit, backend)
    refuse_status(kit, refused, backend)
    caplog.set_level(logging.WARNING, logger="flask_defer")
    signalled: list[tuple[str, int]] = []

    def heard(kind: str) -> Callable[..., None]:
        return lambda _sender, job, **_data: signalled.append((kind, job.id))

    with job_succeeded.connected_to(heard("done")), job_failed.connected_to(heard("failed")):
        summary = kit.defer.run_due()

    # The dropped outcome is not counted, as in the worker: it has not happened yet.
    assert (summary.ran, summary.done, summary.failed) == (3, 2, 1)
    assert sorted(signalled) == [("done", ids[0]), ("done", ids[3]), ("failed", too_big)]
    assert load(kit, too_big).status is JobStatus.FAILED
    assert "the database refused it (" in (load(kit, too_big).last_error or "")
    assert load(kit, refused).status is JobStatus.RUNNING  # dropped: runs after its lease
    assert f"could not write the outcome of job {refused}" in caplog.text
    assert [load(kit, i).result for i in (ids[0], ids[3])] == [{"text": "x" * 10}] * 2


def test_run_due_counts_a_dropped_outcome_against_its_limit(
    make_kit: MakeKit, backend: str
) -> None:
    """``limit`` counts handlers started: a dropped outcome, absent from the summary,
    does not make room for one more job."""
    kit = make_kit()
    runs: list[int] = []

    @kit.defer.job("note")
    def note(job: Job) -> None:
        runs.append(job.id)

    ids = [kit.defer.schedule("note", {"n": n}).id for n in range(3)]
    kit.db.session.commit()
    refuse_status(kit, ids[0], backend)

    summary = kit.defer.run_due(limit=2)

    assert len(runs) == 2 and summary.ran == 1
    assert load(kit, ids[2]).status is JobStatus.PENDING


@pytest.mark.parametrize("history", [True, False], ids=["history", "no_history"])
def test_run_due_counts_a_refused_batch_that_committed_as_written_once(
    make_kit: MakeKit, backend: str, monkeypatch: pytest.MonkeyPatch, history: bool
) -> None:
    """A refusal can come after the batch's statement committed (on PostgreSQL, the
    release of children): ``run_due``'s one-by-one writes then find the rows settled,
    and ask whether the first write was theirs, so each job is done and signalled
    once, not reported lost."""
    kit = make_kit(DEFER_HISTORY=history)
    kit.defer.job("note")(lambda job: None)
    ids = [kit.defer.schedule("note", {"n": n}).id for n in range(3)]
    kit.db.session.commit()
    refusals = acknowledgements_raising_once_after_commit(
        kit.defer.store, monkeypatch, IntegrityError
    )
    succeeded: list[int] = []
    with job_succeeded.connected_to(lambda _sender, job, **_data: succeeded.append(job.id)):
        summary = kit.defer.run_due()

    assert refusals == [3]  # the batch committed all three, then raised
    assert (summary.done, summary.lost) == (3, 0)
    assert sorted(succeeded) == sorted(ids)
    assert {load(kit, i).status for i in ids} == {JobStatus.DONE}
