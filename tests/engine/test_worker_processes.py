"""Real worker processes (``flask defer worker``) against one database: scale-out,
``kill -9``, a PostgreSQL restart, SQLite writer contention and signals.

Each test starts ``tests/worker_app.py`` in child processes and checks the evidence in
the database: every handler run is a row in ``worker_runs``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import select
from sqlalchemy.engine import make_url

from flask_defer import Job, JobStatus
from flask_defer.store import NewJob
from flask_defer.timeutil import utcnow

from .. import worker_app
from ..pg_cluster import PostgresCluster
from ..reply_cutter import ReplyCutter
from ..worker_helpers import ROOT, WorkerProcess, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    """Factory for worker processes, all killed at the end of the test."""
    started: list[WorkerProcess] = []

    def start(database_url: str, *args: str, **config: Any) -> WorkerProcess:
        log = tmp_path / f"worker-{len(started)}.log"
        process = WorkerProcess(database_url, log, *args, **config)
        started.append(process)
        return process

    yield start
    for process in started:
        process.close()


@pytest.fixture
def app(database_url: str) -> Iterator[Flask]:
    """The test's own instance of the worker app: schedules jobs and reads results."""
    app = worker_app.create_app(database_url)
    yield app
    with app.app_context():
        worker_app.db.session.remove()
        worker_app.db.engine.dispose()


def job(app: Flask, job_id: int) -> Job:
    with app.app_context():
        found = worker_app.defer.get(job_id)
    assert found is not None
    return found


def schedule(app: Flask, name: str, payload: Any = None, **options: Any) -> Job:
    with app.app_context():
        scheduled = worker_app.defer.schedule(name, payload, **options)
        worker_app.db.session.commit()
    return scheduled


def runs(app: Flask) -> list[worker_app.Run]:
    return worker_app.runs(app)


def count_done(app: Flask) -> int:
    with app.app_context():
        # Exact: health() bounds settled counts (a dashboard figure), count() does not.
        return worker_app.defer.count(status="done")


# -- scale-out ---------------------------------------------------------------------------


def test_worker_processes_drain_a_backlog_each_job_exactly_once(
    app: Flask, spawn: Any, database_url: str, backend: str
) -> None:
    # PostgreSQL: three processes claiming side by side with SKIP LOCKED. SQLite
    # serialises writers, so two processes and fewer jobs make the same point there.
    total = 2000 if backend == "postgresql" else 500
    workers = [
        spawn(database_url, "--concurrency", "4", DEFER_POLL_INTERVAL=0.1)
        for _ in range(3 if backend == "postgresql" else 2)
    ]
    for worker in workers:
        worker.wait_started()
    now = utcnow()
    with app.app_context():
        store = worker_app.defer.store
        with store.begin() as conn:  # one transaction: one NOTIFY wakes everybody
            store.insert_many(
                conn,
                [NewJob(name="record", payload={"n": n}, run_at=now, max_attempts=3)
                 for n in range(total)],
                now=now,
            )

    wait_until(lambda: count_done(app) == total, timeout=120, interval=0.25)
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait() == 0, worker.log()

    recorded = runs(app)
    per_job = Counter(run.job_id for run in recorded)
    assert len(per_job) == total
    assert max(per_job.values()) == 1, "a job ran twice"
    per_worker = Counter(run.pid for run in recorded)
    assert set(per_worker) == {worker.pid for worker in workers}, per_worker
    for worker in workers:
        assert "Traceback" not in worker.log()


# -- crashes -------------------------------------------------------------------------------


def test_kill_9_mid_handler_is_reclaimed_after_the_lease_and_finished_elsewhere(
    app: Flask, spawn: Any, database_url: str
) -> None:
    lease = {"DEFER_LEASE": 1.5, "DEFER_RECLAIM_INTERVAL": 0.2, "DEFER_POLL_INTERVAL": 0.1}
    victim = spawn(database_url, **lease)
    victim.wait_started()
    scheduled = schedule(app, "slow_first", {"sleep": 60})
    wait_until(lambda: any(run.pid == victim.pid for run in runs(app)))
    held = job(app, scheduled.id)
    assert held.status is JobStatus.RUNNING and held.claim_token

    os.kill(victim.pid, signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    killed_at = time.monotonic()
    rescuer = spawn(database_url, **lease)
    done = wait_until(
        lambda: (found := job(app, scheduled.id)).status is JobStatus.DONE and found,
        timeout=20,
    )

    assert time.monotonic() - killed_at >= 1.0  # not before the lease lapsed
    assert done.attempts == 2
    assert [(run.pid, run.attempt, run.phase) for run in runs(app)] == [
        (victim.pid, 1, "started"),
        (rescuer.pid, 2, "started"),
        (rescuer.pid, 2, "finished"),
    ]
    # The history tells the same story: the victim started it, the rescuer reclaimed
    # its lapsed lease (naming the victim) and started it a second time.
    host = socket.gethostname()
    victim_actor, rescuer_actor = f"worker:{host}:{victim.pid}", f"worker:{host}:{rescuer.pid}"
    with app.app_context():
        history = worker_app.defer.history(scheduled.id)
    assert [(e.event, e.actor, e.attempt) for e in history] == [
        ("scheduled", "app", 0),
        ("started", victim_actor, 1),
        ("reclaimed", rescuer_actor, 1),
        ("started", rescuer_actor, 2),
        ("done", rescuer_actor, 2),
    ]
    assert history[2].error is not None and victim_actor in history[2].error
    # The killed worker's acknowledgement, had it come late, changes nothing.
    with app.app_context():
        store = worker_app.defer.store
        assert not store.ack_done(held, now=utcnow(), result="from beyond")
        assert not store.ack_failed(held, now=utcnow(), error="from beyond")
        assert not store.release([held], now=utcnow())
    assert job(app, scheduled.id) == done
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait() == 0


def test_kill_9_between_handler_and_batched_ack_reruns_only_the_unwritten_jobs(
    app: Flask, spawn: Any, database_url: str
) -> None:
    # A long flush interval opens the window wide: outcomes wait up to 2 s to be
    # written. Jobs whose batch was written before the kill ran once; those whose
    # outcome was still waiting run again after their lease, and nothing is lost.
    settings = {
        "DEFER_LEASE": 3,
        "DEFER_ACK_FLUSH": 2,
        "DEFER_RECLAIM_INTERVAL": 0.2,
        "DEFER_POLL_INTERVAL": 0.1,
    }
    victim = spawn(database_url, **settings)
    victim.wait_started()
    first = [schedule(app, "record", {"n": n}).id for n in range(5)]
    wait_until(lambda: all(job(app, i).status is JobStatus.DONE for i in first), timeout=20)
    second = [schedule(app, "record", {"n": n}).id for n in range(5, 10)]
    wait_until(lambda: {run.job_id for run in runs(app)} >= set(second), timeout=20)
    os.kill(victim.pid, signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    written = {i for i in first + second if job(app, i).status is JobStatus.DONE}
    unwritten = set(first + second) - written
    assert set(first) <= written and unwritten, "the kill must land inside the window"
    assert all(job(app, i).status is JobStatus.RUNNING for i in unwritten)

    rescuer = spawn(database_url, **settings)
    wait_until(
        lambda: all(job(app, i).status is JobStatus.DONE for i in first + second), timeout=30
    )
    per_job = Counter(run.job_id for run in runs(app))
    assert {i: per_job[i] for i in written} == dict.fromkeys(written, 1)
    assert {i: per_job[i] for i in unwritten} == dict.fromkeys(unwritten, 2)
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait() == 0


def test_postgres_restart_under_a_running_worker(tmp_path: Path, spawn: Any) -> None:
    # A server of its own: restarting the suite's shared one would break other tests.
    with PostgresCluster() as cluster:
        url = cluster.create_database("restart_test")
        app = worker_app.create_app(url)
        try:
            worker = spawn(
                url, DEFER_LEASE=2, DEFER_RECLAIM_INTERVAL=0.5, DEFER_POLL_INTERVAL=0.2
            )
            worker.wait_started()
            before = [schedule(app, "record", delay=n * 0.15) for n in range(20)]
            wait_until(lambda: count_done(app) >= 3)

            cluster.restart()
            with app.app_context():
                worker_app.db.engine.dispose()  # the test's own connections died too
            after = [schedule(app, "record", delay=n * 0.1) for n in range(10)]

            wait_until(lambda: count_done(app) == 30, timeout=45, interval=0.25)
            assert worker.process.poll() is None, worker.log()
            ran = {run.job_id for run in runs(app)}
            assert ran == {j.id for j in before + after}
            log = worker.log()
            assert "database error in the worker loop" in log or "LISTEN connection lost" in log
            assert "LISTEN connection re-established" in log
            worker.signal(signal.SIGTERM)
            assert worker.wait() == 0, log
        finally:
            with app.app_context():
                worker_app.db.session.remove()
                worker_app.db.engine.dispose()


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_job_runs_at_most_max_attempts_plus_one_per_database_crash(
    tmp_path: Path, spawn: Any, backend: str
) -> None:
    """README, Guarantees: a claim commits without waiting for the disk, so a database
    crash may forget the attempts of the runs in flight, never more.

    PostgreSQL only: an immediate stop loses WAL that was not flushed, as a crash does;
    SQLite's unflushed commits are lost only by an operating-system crash or power loss,
    which a test cannot cause.
    """
    crashes = 3
    runs_file = tmp_path / "runs.txt"
    with PostgresCluster() as cluster:
        url = cluster.create_database("crash_test")
        app = worker_app.create_app(url)
        try:
            jobs = [
                schedule(app, "fail_to_file", {"file": str(runs_file), "n": n})
                for n in range(300)
            ]
            worker = spawn(
                url,
                DEFER_LEASE=2,
                DEFER_RECLAIM_INTERVAL=0.3,
                DEFER_POLL_INTERVAL=0.1,
                DEFER_RETRY_BASE=0.01,
                DEFER_RETRY_CAP=0.05,
            )
            worker.wait_started()
            for _ in range(crashes):
                lines = len(runs_file.read_text().splitlines()) if runs_file.exists() else 0
                wait_until(
                    lambda n=lines: runs_file.exists()
                    and len(runs_file.read_text().splitlines()) > n + 20
                )
                cluster.crash()
            with app.app_context():
                worker_app.db.engine.dispose()  # the test's own connections died too

            def settled() -> int:
                with app.app_context():
                    return worker_app.defer.count(status="failed")

            wait_until(lambda: settled() == len(jobs), timeout=90, interval=0.5)
            assert worker.process.poll() is None, worker.log()
            per_job = Counter(int(line.split()[0]) for line in runs_file.read_text().splitlines())
            assert set(per_job) == {j.id for j in jobs}  # every job ran; none was lost
            assert max(per_job.values()) <= 3 + crashes, per_job.most_common(3)
            assert min(per_job.values()) >= 3  # every counted attempt ran
            for settled_job in (job(app, j.id) for j in jobs):
                assert settled_job.attempts == 3
            worker.signal(signal.SIGTERM)
            assert worker.wait() == 0, worker.log()
        finally:
            with app.app_context():
                worker_app.db.session.remove()
                worker_app.db.engine.dispose()


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_claim_whose_reply_is_lost_after_its_commit_is_adopted_and_each_job_runs_once(
    app: Flask, database_url: str, spawn: Any, backend: str
) -> None:
    """Guarantees, "attempts count handler starts": a claim that committed but whose
    reply never came (the connection died in between) has its jobs started by the
    worker that sent it, found by its token, not handed back a lease later with an
    attempt spent on nothing. The lease is a minute, so a worker that forgot the claim
    would not finish in time."""
    jobs = [schedule(app, "record") for _ in range(5)]
    url = make_url(database_url)
    assert url.host is not None and url.port is not None
    with ReplyCutter(url.host, url.port, marker=b"attempts = attempts + 1") as cutter:
        relayed = url.set(
            host="127.0.0.1", port=cutter.port, query={**url.query, "sslmode": "disable"}
        ).render_as_string(hide_password=False)
        worker = spawn(relayed, DEFER_LEASE=60, DEFER_POLL_INTERVAL=0.1)
        worker.wait_started()
        wait_until(lambda: count_done(app) == len(jobs), timeout=20, interval=0.1)
        assert cutter.cuts == 1, worker.log()
        log = worker.log()
        assert "database error in the worker loop" in log
        assert "5 job(s) adopted by its token" in log
    assert sorted(run.job_id for run in runs(app)) == [j.id for j in jobs]  # once each
    assert {run.attempt for run in runs(app)} == {1}
    assert {job(app, j.id).attempts for j in jobs} == {1}
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()


# -- SQLite writer contention --------------------------------------------------------------


def test_sqlite_web_writes_while_a_worker_claims_without_database_locked(
    tmp_path: Path, spawn: Any
) -> None:
    url = f"sqlite:///{tmp_path / 'contention.sqlite3'}"
    app = worker_app.create_app(url)
    worker = spawn(url, "--concurrency", "4", DEFER_POLL_INTERVAL=0.05)
    worker.wait_started()
    errors: list[BaseException] = []
    done_ops = Counter[str]()
    due_ids: list[int] = []
    lock = threading.Lock()
    seconds, rate_per_thread = 4.0, 150  # two "web" threads: ~300 writes/s

    def web(thread_no: int) -> None:
        with app.app_context():
            start = time.monotonic()
            for i in range(int(seconds * rate_per_thread)):
                # Pace the writes instead of spinning as fast as possible.
                delay = start + i / rate_per_thread - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                try:
                    if i % 3 == 0:
                        job = worker_app.defer.schedule("record")
                        with lock:
                            due_ids.append(job.id)
                    elif i % 3 == 1:
                        worker_app.defer.schedule(
                            "record", delay=3600, key=f"t{thread_no}:{i}"
                        )
                    worker_app.db.session.commit()
                    if i % 3 == 2:
                        assert worker_app.defer.cancel(key=f"t{thread_no}:{i - 1}")
                    with lock:
                        done_ops["ok"] += 1
                except Exception as error:  # every failure counts, whatever its type
                    worker_app.db.session.rollback()
                    with lock:
                        errors.append(error)
            worker_app.db.session.remove()

    threads = [threading.Thread(target=web, args=(n,)) for n in range(2)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    elapsed = time.monotonic() - started

    assert errors == [], errors[:3]
    rate = done_ops["ok"] / elapsed
    print(f"mixed web writes: {done_ops['ok']} in {elapsed:.1f}s = {rate:.0f}/s")
    wait_until(lambda: count_done(app) == len(due_ids), timeout=30)
    with app.app_context():
        assert worker_app.defer.count(status="cancelled") == len(due_ids)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert "database is locked" not in worker.log()
    with app.app_context():
        worker_app.db.session.remove()
        worker_app.db.engine.dispose()


# -- signals -------------------------------------------------------------------------------


def test_sigterm_lets_a_long_handler_finish_and_exits_0(
    app: Flask, spawn: Any, database_url: str
) -> None:
    worker = spawn(database_url, DEFER_SHUTDOWN_GRACE=20, DEFER_POLL_INTERVAL=0.1)
    worker.wait_started()
    scheduled = schedule(app, "sleep", {"sleep": 1.5})
    wait_until(lambda: runs(app))

    worker.signal(signal.SIGTERM)

    assert worker.wait(20) == 0, worker.log()
    finished = job(app, scheduled.id)
    assert finished.status is JobStatus.DONE and finished.result == "slept"


def test_sigterm_releases_a_job_still_running_after_the_grace(
    app: Flask, spawn: Any, database_url: str
) -> None:
    worker = spawn(database_url, DEFER_SHUTDOWN_GRACE=0.5, DEFER_POLL_INTERVAL=0.1)
    worker.wait_started()
    scheduled = schedule(app, "sleep", {"sleep": 60})
    wait_until(lambda: runs(app))

    worker.signal(signal.SIGTERM)

    assert worker.wait(10) == 0, worker.log()
    released = job(app, scheduled.id)
    assert released.status is JobStatus.PENDING
    assert released.attempts == 0 and released.claim_token is None
    assert f"job {scheduled.id} sleep: still running after the shutdown grace" in worker.log()


def test_second_signal_exits_at_once(app: Flask, spawn: Any, database_url: str) -> None:
    worker = spawn(database_url, DEFER_SHUTDOWN_GRACE=60, DEFER_POLL_INTERVAL=0.1)
    worker.wait_started()
    scheduled = schedule(app, "sleep", {"sleep": 60})
    wait_until(lambda: runs(app))

    worker.signal(signal.SIGINT)
    wait_until(lambda: "SIGINT received" in worker.log())
    asked = time.monotonic()
    worker.signal(signal.SIGTERM)

    assert worker.wait(10) == 128 + signal.SIGTERM
    assert time.monotonic() - asked < 5
    # Nobody acknowledged it: the lease lapses and another worker takes it over.
    assert job(app, scheduled.id).status is JobStatus.RUNNING


# -- the embedded worker under the real reloader ----------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_embedded_worker_starts_once_under_the_reloader(
    app: Flask, database_url: str, tmp_path: Path
) -> None:
    port = _free_port()
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(ROOT),
        WORKER_APP_SQLALCHEMY_DATABASE_URI=database_url,
        WORKER_APP_DEFER_EMBEDDED_WORKER="true",
        WORKER_APP_DEFER_POLL_INTERVAL="0.1",
        WORKER_APP_TEST_LOG="true",
    )
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "flask", "--app", "tests.worker_app", "run",
             "--reload", "--port", str(port)],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        def serving() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/schedule/record") as r:
                    return r.status == 200
            except OSError:
                return False

        wait_until(serving, timeout=30, interval=0.2)
        wait_until(lambda: count_done(app) == 1, timeout=20)
        text = log_path.read_text()
        starts = [line for line in text.splitlines() if "embedded worker started" in line]
        assert len(starts) == 1, text
        child_pid = int(starts[0].rsplit(" ", 1)[1])
        assert child_pid != server.pid  # the reloader's child, not its watcher
        assert [run.pid for run in runs(app)] == [child_pid]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(5)


def test_release_and_acks_of_the_dead_are_noops_on_a_settled_job(
    app: Flask, database_url: str
) -> None:
    # Guard rails of the crash test, without processes: a claim that lapsed and was
    # reclaimed and finished elsewhere can neither heartbeat nor release it.
    scheduled = schedule(app, "record")
    with app.app_context():
        store = worker_app.defer.store
        now = utcnow()
        [dead] = store.claim(now=now, limit=1, token="dead", lease_until=now)
        returned, _ = store.reclaim_lapsed(now=now + timedelta(seconds=1))
        assert returned == 1
        worker_app.defer.run_due(now=now + timedelta(seconds=2))
        assert store.extend_leases([dead], now=now, lease_until=now + timedelta(hours=1)) == 0
        assert store.release([dead], now=now) == 0
    assert job(app, scheduled.id).status is JobStatus.DONE
    with app.app_context():
        assert worker_app.db.session.scalars(
            select(worker_app.Run.job_id)
        ).all() == [scheduled.id]


# -- recurring schedules ---------------------------------------------------------------


def test_worker_processes_write_every_tick_of_a_one_second_schedule_exactly_once(
    spawn: Any, database_url: str, backend: str
) -> None:
    # Three processes on PostgreSQL for 20 s; SQLite, one writer at a time, two
    # processes for 15 s. Every process syncs the same declaration and races for
    # every tick: the compare-and-set on the schedule's next tick lets one win. (It
    # ran a minute on PostgreSQL, then 30 s, still the suite's longest test at 36 s;
    # 20 s still races three processes for about twenty ticks.)
    app = worker_app.create_app(database_url, RECURRING_EVERY=1)
    seconds = 20 if backend == "postgresql" else 15
    try:
        workers = [
            spawn(database_url, "--concurrency", "2", RECURRING_EVERY=1)
            for _ in range(3 if backend == "postgresql" else 2)
        ]
        for worker in workers:
            worker.wait_started()
        time.sleep(seconds)
        with app.app_context():
            assert worker_app.defer.pause_recurring("heartbeat")
            (schedule,) = worker_app.defer.list_recurring()

        def ticks() -> list[Job]:
            with app.app_context():
                return worker_app.defer.list(key_prefix="recurring:heartbeat:", limit=10_000)

        wait_until(
            lambda: all(j.status == JobStatus.DONE for j in ticks()), timeout=30, interval=0.25
        )
        for worker in workers:
            worker.signal(signal.SIGTERM)
        for worker in workers:
            assert worker.wait() == 0, worker.log()

        jobs = sorted(ticks(), key=lambda j: j.run_at)
        assert schedule.last_run_at == jobs[-1].run_at
        span = int((jobs[-1].run_at - jobs[0].run_at).total_seconds())
        expected = [jobs[0].run_at + timedelta(seconds=n) for n in range(span + 1)]
        recorded = runs(app)
        per_job = Counter(run.job_id for run in recorded)
        keys = Counter(j.key for j in jobs)
        duplicates = sum(n - 1 for n in keys.values()) + sum(n - 1 for n in per_job.values())
        ran_at = {r.job_id: r.at if r.at.tzinfo else r.at.replace(tzinfo=UTC) for r in recorded}
        lateness = [(ran_at[j.id] - j.run_at).total_seconds() for j in jobs if j.id in ran_at]
        median = sorted(lateness)[len(lateness) // 2]
        print(
            f"\n{backend}: {len(workers)} workers, {seconds} s: expected {len(expected)} ticks, "
            f"ran {len(per_job)}, duplicates {duplicates}; lateness median "
            f"{median * 1000:.0f} ms, max {max(lateness) * 1000:.0f} ms"
        )
        assert [j.run_at for j in jobs] == expected, "a tick is missing"
        assert len(expected) >= seconds - 5
        assert duplicates == 0
        assert set(per_job) == {j.id for j in jobs}, "a tick's job did not run"
        for worker in workers:
            assert "Traceback" not in worker.log()
    finally:
        with app.app_context():
            worker_app.db.session.remove()
            worker_app.db.engine.dispose()


def test_worker_processes_run_each_groups_callback_once_after_its_last_member(
    app: Flask, spawn: Any, database_url: str, backend: str
) -> None:
    # Many small groups, so the last members of a group often finish at the same
    # moment in two processes: each callback must still be released exactly once.
    groups_count, size = (60, 4) if backend == "postgresql" else (30, 3)
    workers = [
        spawn(database_url, "--concurrency", "4", DEFER_POLL_INTERVAL=0.1) for _ in range(2)
    ]
    for worker in workers:
        worker.wait_started()
    with app.app_context():
        groups = [
            worker_app.defer.group("record", [{"g": g, "m": m} for m in range(size)],
                                   then="record", then_payload={"g": g})
            for g in range(groups_count)
        ]  # fmt: skip
        worker_app.db.session.commit()
    total = groups_count * (size + 1)
    wait_until(lambda: count_done(app) == total, timeout=120, interval=0.25)
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait() == 0, worker.log()

    recorded = runs(app)
    per_job = Counter(run.job_id for run in recorded)
    assert len(per_job) == total and max(per_job.values()) == 1, "a job ran twice"
    at = {run.job_id: run.at for run in recorded}
    for group in groups:
        assert at[group.id] >= max(at[member.id] for member in group.jobs)
    assert len({run.pid for run in recorded}) == 2, "both processes ran jobs"
    for worker in workers:
        assert "Traceback" not in worker.log()


def test_worker_processes_share_one_rate_limit(
    app: Flask, spawn: Any, database_url: str, backend: str
) -> None:
    # Two processes claiming from one bucket of 10/s: the claims (the jobs' started
    # events, on the claiming worker's clock) never exceed 10 in any second.
    total = 45
    workers = [
        spawn(database_url, "--concurrency", "4", DEFER_POLL_INTERVAL=0.05) for _ in range(2)
    ]
    for worker in workers:
        worker.wait_started()
    with app.app_context():
        jobs = [worker_app.defer.schedule("rate_limited", {"n": n}) for n in range(total)]
        worker_app.db.session.commit()
    wait_until(lambda: count_done(app) == total, timeout=60, interval=0.25)
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait() == 0, worker.log()
    with app.app_context():
        starts = sorted(
            event.at.timestamp()
            for job in jobs
            for event in worker_app.defer.history(job.id)
            if event.event == "started"
        )
    assert len(starts) == total
    most = max(sum(1 for t in starts if a <= t < a + 1.0) for a in starts)
    assert most <= 10, f"{most} starts in one second"
    assert starts[-1] - starts[0] < 6.0, "the limit held, but the drain dawdled"
    per_job = Counter(run.job_id for run in runs(app))
    assert max(per_job.values()) == 1


def test_a_worker_killed_with_sigkill_shows_as_stale_within_two_heartbeats(
    app: Flask, spawn: Any, database_url: str
) -> None:
    worker = spawn(database_url, DEFER_LEASE=1.5)  # a heartbeat every 0.5 s
    worker.wait_started()

    def rows() -> list[Any]:
        with app.app_context():
            return worker_app.defer.workers()

    (info,) = wait_until(lambda: [w for w in rows() if w.pid == worker.pid], timeout=20)
    assert not info.stale and info.heartbeat_seconds == 0.5
    worker.signal(signal.SIGKILL)
    worker.wait()
    killed = time.monotonic()

    def marked_stale() -> bool:
        listed = [w for w in rows() if w.pid == worker.pid]
        assert len(listed) == 1, listed  # the killed worker's row stays, marked stale
        return listed[0].stale

    wait_until(marked_stale, timeout=10)
    # Two missed heartbeats (1 s), plus the last beat's age at the kill (≤ 0.5 s).
    assert time.monotonic() - killed < 3.0
    with app.app_context():
        assert worker_app.defer.health().unserved_queues == ()  # nothing due
