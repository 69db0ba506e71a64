"""An outcome the database refuses for its values holds none of the others back, on
both backends: a worker whose batch of outcomes fails on one job's row (an app's
trigger on the jobs table, here) writes the others one by one, drops only the refused
one, and that job runs again once its lease lapses."""

from __future__ import annotations

import logging
import threading

import pytest
from sqlalchemy import text

from flask_defer import Job, JobStatus

from ..conftest import AppKit
from ..worker_helpers import wait_until, worker_thread
from .test_worker import MakeKit, load, make_kit

__all__ = ["make_kit"]


def refuse_done(kit: AppKit, job_id: int, backend: str) -> None:
    """An app's trigger that refuses to mark *job_id* done."""
    table = kit.defer.store.table.name
    if backend == "sqlite":
        statements = [
            f"CREATE TRIGGER refuse_done BEFORE UPDATE OF status ON {table}"
            f" WHEN NEW.id = {job_id} AND NEW.status = 'done'"
            " BEGIN SELECT RAISE(ABORT, 'refused by the app'); END"
        ]
    else:
        statements = [
            "CREATE FUNCTION refuse_done() RETURNS trigger LANGUAGE plpgsql AS $$"
            f" BEGIN IF NEW.id = {job_id} AND NEW.status = 'done' THEN"
            " RAISE EXCEPTION 'refused by the app'; END IF; RETURN NEW; END $$",
            f"CREATE TRIGGER refuse_done BEFORE UPDATE ON {table}"
            " FOR EACH ROW EXECUTE FUNCTION refuse_done()",
        ]
    with kit.defer.store.begin() as conn:
        for statement in statements:
            conn.execute(text(statement))


def test_an_outcome_the_database_refuses_holds_none_of_the_others_back(
    make_kit: MakeKit, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Outcomes wait 0.3 s for each other, so the four go in one batch; a lease of
    # 1.5 s lapses soon after the refused one is dropped.
    kit = make_kit(DEFER_ACK_FLUSH=0.3, DEFER_LEASE=1.5)
    ran: list[int] = []
    lock = threading.Lock()

    @kit.defer.job("note")
    def note(job: Job) -> None:
        with lock:
            ran.append(job.id)

    ids = [kit.defer.schedule("note", {"n": n}).id for n in range(4)]
    kit.db.session.commit()
    refused = ids[1]
    refuse_done(kit, refused, backend)
    caplog.set_level(logging.WARNING, logger="flask_defer.worker")
    with kit.app.app_context():
        worker = kit.defer.worker(concurrency=4)
    with worker_thread(worker):
        others = [i for i in ids if i != refused]
        wait_until(lambda: all(load(kit, i).status is JobStatus.DONE for i in others), timeout=15)
        assert load(kit, refused).status is JobStatus.RUNNING  # its outcome was dropped
        assert f"could not write the outcome of job {refused}" in caplog.text
        assert "refused by the app" in caplog.text
        on_table = "" if backend == "sqlite" else f" ON {kit.defer.store.table.name}"
        with kit.defer.store.begin() as conn:
            conn.execute(text(f"DROP TRIGGER refuse_done{on_table}"))
        # Nothing lost: the lease lapses and the job runs again, written this time.
        wait_until(lambda: load(kit, refused).status is JobStatus.DONE, timeout=15)
    assert sorted(ran) == sorted(ids + [refused])
