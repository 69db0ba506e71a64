"""Live workers on both backends: each worker (and ``run_due`` while it holds jobs)
keeps a row, ``defer.workers()`` reads them, a silent worker turns stale, health flags
queues nobody serves and workers that cannot hear, ``flask defer workers`` and the
dashboard's Workers page."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from sqlalchemy import event

from flask_defer import Job, WorkerInfo
from flask_defer.engine.presence import Presence
from flask_defer.timeutil import utcnow

from ..conftest import AppKit
from ..engine.test_worker import MakeKit, make_kit
from ..worker_helpers import wait_until, worker_thread

__all__ = ["make_kit"]


@pytest.fixture
def kit(make_kit: MakeKit) -> AppKit:
    # A lease of 1.5 s: a heartbeat every half second.
    return make_kit(DEFER_LEASE=1.5)


def test_a_worker_keeps_a_row_while_it_runs_with_the_jobs_it_holds(kit: AppKit) -> None:
    started, finish = threading.Event(), threading.Event()

    @kit.defer.job("hold", queue="mail")
    def hold(job: Job) -> None:
        started.set()
        assert finish.wait(20)

    job = kit.defer.schedule("hold")
    kit.db.session.commit()
    assert kit.defer.workers() == []
    with worker_thread(kit.defer.worker(queues=["mail", "default"], concurrency=3)):
        assert started.wait(20)
        (info,) = wait_until(
            lambda: [w for w in kit.defer.workers() if job.id in w.running], timeout=10
        )
        assert isinstance(info, WorkerInfo)
        assert (info.kind, info.queues, info.concurrency, info.stale) == (
            "worker", ("default", "mail"), 3, False,
        )  # fmt: skip
        assert info.heartbeat_seconds == pytest.approx(0.5)
        assert info.serves("mail") and not info.serves("other")
        finish.set()
        wait_until(lambda: kit.defer.workers()[0].running == (), timeout=10)
    assert kit.defer.workers() == []  # a graceful stop deletes the row


def test_a_worker_that_stops_beating_turns_stale_and_is_forgotten_after_a_day(
    kit: AppKit,
) -> None:
    store = kit.defer.store
    presence = Presence(store, kind="worker", queues=None, concurrency=2, heartbeat_seconds=0.5)
    presence.arrive(utcnow() - timedelta(seconds=5))  # and then nothing: killed
    (info,) = kit.defer.workers()
    assert info.stale and info.id == presence.id and info.queues == ()
    presence.beat(utcnow(), [])
    assert not kit.defer.workers()[0].stale
    assert store.forget_workers(now=utcnow() + timedelta(hours=1)) == 0
    assert store.forget_workers(now=utcnow() + timedelta(days=1, minutes=1)) == 1
    assert kit.defer.workers() == []
    presence.beat(utcnow(), [7])  # a worker back from a day-long stall writes its row again
    assert kit.defer.workers()[0].running == (7,)


def test_run_due_keeps_a_row_while_it_holds_jobs(kit: AppKit) -> None:
    seen: list[list[WorkerInfo]] = []

    @kit.defer.job("look")
    def look(job: Job) -> None:
        # Until the first heartbeat has written the row (0.5 s in on a quiet machine;
        # a fixed sleep raced a loaded one).
        seen.append(wait_until(kit.defer.workers, timeout=10))

    kit.defer.schedule("look")
    kit.db.session.commit()
    kit.defer.run_due()
    assert [w.kind for w in seen[0]] == ["run_due"]
    assert kit.defer.workers() == []


def test_a_run_due_over_within_a_heartbeat_writes_no_worker_row(make_kit: MakeKit) -> None:
    """A call that is over within its first heartbeat writes and deletes no row (that
    heartbeat would write it, as the test above shows). The lease is 6 s here, a heartbeat
    every 2 s, so that a busy host cannot stretch the 0.2 s call past its first beat."""
    kit = make_kit(DEFER_LEASE=6)
    seen: list[list[WorkerInfo]] = []
    statements: list[str] = []
    table = kit.defer.store.workers_table.name

    def listen(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if table in statement:
            statements.append(statement.split()[0].upper())

    @kit.defer.job("quick")
    def quick(job: Job) -> None:
        import time

        time.sleep(0.2)  # the heartbeat thread is running by now
        seen.append(kit.defer.workers())

    kit.defer.schedule("quick")
    kit.db.session.commit()
    event.listen(kit.defer.store.engine, "before_cursor_execute", listen)
    try:
        assert kit.defer.run_due().done == 1
    finally:
        event.remove(kit.defer.store.engine, "before_cursor_execute", listen)
    assert seen == [[]]
    assert [s for s in statements if s in ("INSERT", "UPDATE", "DELETE")] == []


def test_a_presence_written_at_its_first_beat_deletes_only_what_it_wrote(kit: AppKit) -> None:
    store = kit.defer.store
    never = Presence(store, kind="run_due", queues=None, concurrency=1,
                     heartbeat_seconds=0.5, at_first_beat=True)  # fmt: skip
    never.arrive(utcnow())
    assert kit.defer.workers() == []
    never.leave()
    beaten = Presence(store, kind="run_due", queues=None, concurrency=1,
                      heartbeat_seconds=0.5, at_first_beat=True)  # fmt: skip
    started = utcnow()
    beaten.arrive(started)
    beaten.beat(utcnow(), [42])
    (info,) = kit.defer.workers()
    assert (info.id, info.kind, info.running, info.started_at) == (
        beaten.id, "run_due", (42,), started,
    )  # fmt: skip
    beaten.leave()
    assert kit.defer.workers() == []


def test_health_flags_queues_nobody_serves_and_workers_that_cannot_hear(kit: AppKit) -> None:
    kit.defer.job("send", queue="mail")(lambda job: None)
    kit.defer.job("sync", queue="billing")(lambda job: None)
    kit.defer.schedule("send")
    kit.defer.schedule("sync")
    kit.db.session.commit()
    assert kit.defer.health().unserved_queues == ("billing", "mail")  # nobody runs
    store = kit.defer.store
    mail_only = Presence(store, kind="worker", queues=["mail"], concurrency=1,
                         heartbeat_seconds=30, listening=lambda: False)  # fmt: skip
    mail_only.arrive(utcnow())
    health = kit.defer.health()
    assert health.unserved_queues == ("billing",)
    assert health.deaf_workers == (mail_only.id,)
    assert health.as_dict()["unserved_queues"] == ["billing"]
    everything = Presence(store, kind="worker", queues=None, concurrency=1, heartbeat_seconds=30)
    everything.arrive(utcnow())
    assert kit.defer.health().unserved_queues == ()
    kit.defer.dashboard_auth(lambda: True)
    everything.leave()
    page = kit.app.test_client().get("/defer/").get_data(as_text=True)
    assert 'data-defer-figure="unserved"' in page and 'data-defer-figure="deaf"' in page


def test_flask_defer_workers_prints_them_and_json(kit: AppKit) -> None:
    cli = kit.app.test_cli_runner()
    assert cli.invoke(args=["defer", "workers"]).output.strip() == "no workers"
    assert json.loads(cli.invoke(args=["defer", "workers", "--json"]).output) == []
    presence = Presence(kit.defer.store, kind="worker", queues=["mail"], concurrency=4,
                        heartbeat_seconds=30)  # fmt: skip
    presence.arrive(utcnow())
    text = cli.invoke(args=["defer", "workers"]).output
    assert presence.id in text and "live" in text and "mail" in text and "4 thread(s)" in text
    (row,) = json.loads(cli.invoke(args=["defer", "workers", "--json"]).output)
    assert row["id"] == presence.id and row["queues"] == ["mail"] and row["stale"] is False
    assert row["running"] == [] and row["started_at"].endswith("+00:00")


def test_the_workers_page_lists_them_for_operators_only(kit: AppKit) -> None:
    client = kit.app.test_client()
    assert client.get("/defer/workers").status_code == 403
    kit.defer.dashboard_auth(lambda: True)
    assert "No worker is running" in client.get("/defer/workers").get_data(as_text=True)
    presence = Presence(kit.defer.store, kind="worker", queues=None, concurrency=2,
                        heartbeat_seconds=30)  # fmt: skip
    presence.arrive(utcnow())
    presence.beat(utcnow(), [41, 42])
    page = client.get("/defer/workers").get_data(as_text=True)
    assert f'data-defer-worker="{presence.id}"' in page and 'data-defer-state="live"' in page
    assert f'<a id="defer-worker-{presence.id}-job-41" href="/defer/jobs/41">#41</a>' in page
    fragment = client.get("/defer/workers", headers={"HX-Request": "true"}).get_data(as_text=True)
    assert fragment.lstrip().startswith('<div id="defer-workers"')
