"""The embedded development worker: started once, in the process that serves requests.

The end-to-end check under the real Werkzeug reloader is in
``test_worker_processes.py``; these tests pin down the start rules in-process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import click
import pytest
from flask.cli import run_command

from flask_defer import JobStatus
from flask_defer.engine.embedded import EmbeddedWorker

from ..conftest import AppKit
from ..worker_helpers import wait_until

EMBEDDED = {"DEFER_EMBEDDED_WORKER": True, "DEFER_POLL_INTERVAL": 0.05}


@pytest.fixture
def stop_embedded() -> Iterator[Callable[[AppKit], EmbeddedWorker]]:
    """Look up an app's embedded worker; stop it after the test."""
    seen: list[EmbeddedWorker] = []

    def get(kit: AppKit) -> EmbeddedWorker:
        embedded = kit.app.extensions["defer.embedded_worker"]
        assert isinstance(embedded, EmbeddedWorker)
        seen.append(embedded)
        return embedded

    yield get
    for embedded in seen:
        embedded.stop(timeout=15)
        assert embedded.thread is None or not embedded.thread.is_alive()


def test_starts_at_the_first_request_once_and_runs_jobs(
    make_app: Callable[..., AppKit], stop_embedded: Callable[[AppKit], EmbeddedWorker]
) -> None:
    kit = make_app(**EMBEDDED)
    embedded = stop_embedded(kit)
    ran: list[int] = []
    kit.defer.job("hello")(lambda job: ran.append(job.id))
    with kit.app.app_context():
        kit.db.create_all()
    assert not embedded.started  # importing the app (flask shell, a CLI command) starts nothing

    client = kit.app.test_client()
    client.get("/")
    thread = embedded.thread
    client.get("/")
    assert embedded.started and embedded.thread is thread

    with kit.app.app_context():
        job = kit.defer.schedule("hello")
        kit.db.session.commit()
        wait_until(lambda: (j := kit.defer.get(job.id)) and j.status is JobStatus.DONE)
    assert ran == [job.id]


def test_starts_at_init_in_the_reloaders_child(
    make_app: Callable[..., AppKit],
    stop_embedded: Callable[[AppKit], EmbeddedWorker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WERKZEUG_RUN_MAIN", "true")
    kit = make_app(**EMBEDDED)
    assert stop_embedded(kit).started


@pytest.mark.parametrize(("reload", "starts"), [(True, False), (False, True), (None, True)])
def test_flask_run_starts_it_at_init_only_without_the_reloader(
    make_app: Callable[..., AppKit],
    stop_embedded: Callable[[AppKit], EmbeddedWorker],
    monkeypatch: pytest.MonkeyPatch,
    reload: bool | None,
    starts: bool,
) -> None:
    # `flask run` loads the app inside the run command; with the reloader on, this
    # process is the watcher, which never serves (its child starts the worker).
    monkeypatch.delenv("WERKZEUG_RUN_MAIN", raising=False)
    monkeypatch.setenv("FLASK_DEBUG", "0")
    ctx = click.Context(run_command, info_name="run")
    ctx.params["reload"] = reload
    with ctx:
        kit = make_app(**EMBEDDED)
    assert stop_embedded(kit).started is starts


def test_off_by_default(make_app: Callable[..., AppKit]) -> None:
    kit = make_app()
    kit.app.test_client().get("/")
    assert "defer.embedded_worker" not in kit.app.extensions


def test_on_a_schema_that_does_not_match_it_waits_says_why_and_starts_once_current(
    make_app: Callable[..., AppKit],
    stop_embedded: Callable[[AppKit], EmbeddedWorker],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # flask defer worker refuses such a schema; the embedded one cannot refuse the
    # web, so it waits and starts by itself after the upgrade (here: create_all).
    kit = make_app(**EMBEDDED)
    embedded = stop_embedded(kit)
    ran: list[int] = []
    kit.defer.job("hello")(lambda job: ran.append(job.id))
    caplog.set_level(logging.INFO, logger="flask_defer.worker")
    kit.app.test_client().get("/")  # starts the thread; no tables yet
    assert embedded.started
    wait_until(lambda: "the embedded worker waits to start" in caplog.text)
    assert embedded.thread is not None and embedded.thread.is_alive()
    with kit.app.app_context():
        kit.db.create_all()
        job = kit.defer.schedule("hello")
        kit.db.session.commit()
        wait_until(lambda: (j := kit.defer.get(job.id)) and j.status is JobStatus.DONE)
    assert ran == [job.id]
    assert caplog.text.count("the embedded worker waits to start") == 1
    assert "the schema is current now" in caplog.text


def test_a_stop_while_it_waits_for_the_schema_ends_the_thread(
    make_app: Callable[..., AppKit], stop_embedded: Callable[[AppKit], EmbeddedWorker]
) -> None:
    kit = make_app(**EMBEDDED)
    embedded = stop_embedded(kit)
    kit.app.test_client().get("/")
    assert embedded.thread is not None
    embedded.stop(timeout=5)
    assert not embedded.thread.is_alive()
