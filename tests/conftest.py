"""Shared fixtures: both database backends, app factories, and leak detectors.

Every store and worker test is parametrised over ``sqlite`` and ``postgresql``. The
PostgreSQL server is a throwaway cluster the suite starts itself (``pg_cluster.py``),
or the one named by ``DEFER_TEST_POSTGRES_URL``; each test gets a fresh database, so
tests never see each other's rows.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.globals import _cv_app
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import Engine, MetaData, create_engine
from sqlalchemy.orm import DeclarativeBase
from werkzeug.serving import WSGIRequestHandler, make_server

from flask_defer import Defer
from flask_defer.store import JobStore, NewJob
from flask_defer.store.schema import define_history_table, define_jobs_table

from .long_first import long_tests_first
from .pg_cluster import PostgresCluster
from .pg_databases import EmptyDatabases
from .screenshots import DOCS_SCREENSHOTS, OPTION, publish
from .template_cache import share_compiled_templates
from .url_rule_cache import share_compiled_url_builders

BACKENDS = ["sqlite", "postgresql"]

share_compiled_templates()
share_compiled_url_builders()


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """URL of a PostgreSQL server for the whole run (its maintenance database)."""
    configured = os.environ.get("DEFER_TEST_POSTGRES_URL")
    if configured:
        yield configured
        return
    cluster = PostgresCluster()
    cluster.start()
    try:
        yield cluster.url
    finally:
        cluster.stop()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The backend under test: ``sqlite`` or ``postgresql``."""
    return str(request.param)


@pytest.fixture(scope="session")
def _empty_databases(postgres_server_url: str) -> Iterator[EmptyDatabases]:
    databases = EmptyDatabases(postgres_server_url)
    yield databases
    databases.close()


@pytest.fixture
def database_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, empty database on the backend under test."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
        return
    databases: EmptyDatabases = request.getfixturevalue("_empty_databases")
    url = databases.take()
    yield url
    databases.give_back(url)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """A bare engine on the fresh database, disposed after the test."""
    engine = create_engine(database_url)
    if engine.dialect.name == "sqlite":
        from sqlalchemy import event

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA busy_timeout = 10000")
            cursor.close()

    yield engine
    engine.dispose()


@pytest.fixture
def store(engine: Engine) -> JobStore:
    """A store over a bare engine with its table created: no Flask involved."""
    store = JobStore(engine, define_jobs_table(MetaData()))
    store.create_table()
    return store


@pytest.fixture
def history_store(engine: Engine) -> JobStore:
    """A bare store with its history table, as ``init_app`` builds it by default."""
    metadata = MetaData()
    jobs = define_jobs_table(metadata)
    store = JobStore(engine, jobs, define_history_table(metadata, jobs.name))
    store.create_table()
    return store


@pytest.fixture
def now() -> datetime:
    """A fixed "now" for tests that drive the clock."""
    return datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def new_job() -> Callable[..., NewJob]:
    """Factory for the store's NewJob with sensible defaults."""

    def make(**overrides: Any) -> NewJob:
        values: dict[str, Any] = {
            "name": "send_email",
            "payload": {"message_id": 7},
            "run_at": datetime(2030, 1, 1, 12, 0, tzinfo=UTC),
            "max_attempts": 3,
        }
        values.update(overrides)
        return NewJob(**values)

    return make


class Base(DeclarativeBase):
    pass


@dataclass
class AppKit:
    """A Flask app wired with Flask-SQLAlchemy and Defer, as an application would be."""

    app: Flask
    db: SQLAlchemy
    defer: Defer

    def context(self) -> Any:
        return self.app.app_context()


@pytest.fixture
def make_app(database_url: str) -> Iterator[Callable[..., AppKit]]:
    """Factory: a fresh app on the backend under test, its tables created.

    Handlers are registered by the test on ``kit.defer``; config overrides are passed
    as keyword arguments (``make_app(DEFER_LEASE=5)``).
    """
    made: list[AppKit] = []

    def make(**config: Any) -> AppKit:
        class Model(DeclarativeBase):
            pass

        db = SQLAlchemy(model_class=Model)
        defer = Defer()
        app = Flask(f"test_app_{len(made)}")
        app.config.update(
            SQLALCHEMY_DATABASE_URI=database_url,
            SECRET_KEY="test-secret",
            TESTING=True,
            DEFER_RETRY_BASE=timedelta(seconds=10),
        )
        app.config.update(config)
        db.init_app(app)
        defer.init_app(app, db=db)
        kit = AppKit(app, db, defer)
        made.append(kit)
        return kit

    yield make
    for kit in made:
        with kit.app.app_context():
            kit.db.session.remove()
            for engine in kit.db.engines.values():
                engine.dispose()


@pytest.fixture
def kit(make_app: Callable[..., AppKit]) -> Iterator[AppKit]:
    """One app with its tables created and an app context pushed for the test."""
    kit = make_app()
    with kit.app.app_context():
        kit.db.create_all()
        yield kit
        kit.db.session.rollback()


@pytest.fixture(autouse=True)
def _no_leaked_app_context() -> Iterator[None]:
    """Fail a test that leaves an application context pushed."""
    before = _cv_app.get(None)
    yield
    after = _cv_app.get(None)
    assert after is before, "the test left a Flask application context pushed"


# -- browser tests (Playwright driving real headless Chromium) --------------------------

#: Flags for a headless Chromium in a container or CI without a desktop session.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(report: Any) -> Any:
    """A test report's text with every lone surrogate escaped (``\\udc80``).

    pytest-xdist sends each report from the worker process as UTF-8, which cannot hold a
    lone surrogate: a test whose captured log shows one (the job error of
    ``test_execution.py``'s NUL test) crashed its worker with an internal error.
    """
    data = yield
    return _without_surrogates(data)


def _without_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {key: _without_surrogates(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_without_surrogates(item) for item in value)
    return value


@pytest.hookimpl(trylast=True)  # after -m has deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The long tests first, spread over the test processes (``tests/long_first``)."""
    workerinput = getattr(config, "workerinput", None)
    long_tests_first(items, int(workerinput["workercount"]) if workerinput else 1)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Empty pytest-playwright's output folder once per run, before any test starts.

    Under pytest-xdist this runs in the controlling process only (a worker has
    ``workerinput``), before the workers start; see ``delete_output_dir``.
    """
    if hasattr(session.config, "workerinput"):
        return
    output = Path(session.config.getoption("--output"))
    if output.is_dir():
        shutil.rmtree(output, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def delete_output_dir() -> None:
    """Replaces pytest-playwright's fixture of that name, which empties ``test-results/``.

    The plugin's fixture runs at the first test of every session, and under pytest-xdist
    every worker process is a session: a worker starting its first test late would delete
    the screenshots another worker had just saved there (``artifacts``). The folder is
    emptied once per run in ``pytest_sessionstart`` instead.
    """


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    """pytest-playwright's launch arguments, pointed at the system's Chromium.

    The test command installs Chromium's headless shell from the distribution
    (``DEFER_TEST_CHROMIUM`` names another binary); Playwright's own browser download
    is never needed. The headless shell is the build Playwright itself launches for
    headless Chromium: the same Blink and V8 without the desktop browser around them.
    The full ``chromium`` in headless mode, found when the shell is not installed, drew
    the same pages with 1.2 to 2.4 times the CPU (the layout, undo and other browser
    files, each alone), and the suite's run time is bound by CPU.
    """
    executable = (
        os.environ.get("DEFER_TEST_CHROMIUM")
        or shutil.which("chromium-headless-shell")
        or shutil.which("chromium")
        or "/usr/bin/chromium-headless-shell"
    )
    return {
        **browser_type_launch_args,
        "executable_path": executable,
        "headless": True,
        "args": CHROMIUM_ARGS,
    }


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, *args: Any, **kwargs: Any) -> None:
        pass


class LiveServers:
    """Serve WSGI apps on 127.0.0.1 (a free port each) in threads: ``url = live(app)``.

    ``stop()`` shuts every server down and waits until the requests in flight have
    returned. An app fixture calls it before disposing its engines: a browser page
    still polling could otherwise be mid-request while the pool is disposed, and the
    connection that request returns afterwards lands in the discarded pool, left open
    for the garbage collector.
    """

    def __init__(self) -> None:
        self._running: list[tuple[Any, threading.Thread]] = []
        self._idle = threading.Condition()
        # The threads inside the app now (a request whose body was never closed, its
        # thread gone, is not in flight any more: only a live thread can hold a pool
        # connection).
        self._serving: dict[threading.Thread, int] = {}

    def __call__(self, app: Any) -> str:
        server = make_server(
            "127.0.0.1", 0, self._counted(app), threaded=True, request_handler=_QuietHandler
        )
        thread = threading.Thread(target=server.serve_forever, name="live-app", daemon=True)
        thread.start()
        self._running.append((server, thread))
        return f"http://127.0.0.1:{server.server_port}"

    def stop(self, timeout: float = 30) -> None:
        """Stop accepting requests, then wait up to *timeout* s for those in flight."""
        running, self._running = self._running, []
        for server, thread in running:
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)
        with self._idle:
            deadline = time.monotonic() + timeout
            while self._in_flight() and time.monotonic() < deadline:
                self._idle.wait(0.1)
            assert not self._in_flight(), (
                f"{self._in_flight()} request(s) still running {timeout} s after the stop"
            )

    def _in_flight(self) -> int:
        return sum(n for thread, n in self._serving.items() if thread.is_alive())

    def _counted(self, app: Any) -> Any:
        def counted(environ: Any, start_response: Any) -> Any:
            me = threading.current_thread()
            with self._idle:
                self._serving[me] = self._serving.get(me, 0) + 1
            try:
                body = app(environ, start_response)
            except BaseException:
                self._finished(me)
                raise
            return _Finally(body, lambda: self._finished(me))

        return counted

    def _finished(self, thread: threading.Thread) -> None:
        with self._idle:
            left = self._serving.get(thread, 1) - 1
            if left > 0:
                self._serving[thread] = left
            else:
                self._serving.pop(thread, None)
            self._idle.notify_all()


class _Finally:
    """A response body whose ``close`` runs *done* even when the app's own close raises.

    (werkzeug's ``ClosingIterator`` skips its callbacks then, which left a request
    counted as in flight for ever.)
    """

    def __init__(self, body: Any, done: Callable[[], None]) -> None:
        self._body = body
        self._done = done

    def __iter__(self) -> Iterator[Any]:
        return iter(self._body)

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            self._done()


@pytest.fixture
def live_server() -> Iterator[LiveServers]:
    """Factory: serve a WSGI app on 127.0.0.1 (a free port) in a thread; returns its URL.

    Real HTTP for the browser tests; every server is shut down after the test (fixtures
    that dispose an app call ``live_server.stop()`` first).
    """
    servers = LiveServers()
    yield servers
    servers.stop()


@pytest.fixture
def new_browser_context(browser: Any) -> Iterator[Callable[..., Any]]:
    """Factory: a fresh browser context (its own cookies: a separate person), closed after."""
    contexts: list[Any] = []

    def new_context(**context_args: Any) -> Any:
        context = browser.new_context(**context_args)
        contexts.append(context)
        return context

    yield new_context
    for context in contexts:
        context.close()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        OPTION,
        action="store_true",
        default=False,
        help="also copy the documentation's screenshots to docs/screenshots (make screenshots)",
    )


@pytest.fixture
def docs_screenshot(request: pytest.FixtureRequest) -> Callable[[Path, str], Path | None]:
    """Factory: publish a screenshot under docs/screenshots, only with --docs-screenshots.

    Without the option (``make test``) it checks the shot exists and writes nothing.
    """
    docs = DOCS_SCREENSHOTS if request.config.getoption(OPTION) else None

    def publish_shot(shot: Path, name: str) -> Path | None:
        return publish(shot, name, docs)

    return publish_shot


@pytest.fixture
def artifacts(request: pytest.FixtureRequest) -> Path:
    """Where screenshots are saved (``test-results/``, ignored by git)."""
    folder = Path(request.config.rootpath) / "test-results"
    folder.mkdir(exist_ok=True)
    return folder


#: axe-core impact levels that fail an accessibility check.
BLOCKING_IMPACTS = ("serious", "critical")


@pytest.fixture
def axe_violations() -> Callable[[Any], list[dict[str, Any]]]:
    """Factory: run axe-core on a Playwright page; return its serious and critical violations.

    Each item is axe's violation record (``id``, ``impact``, ``help``, ``nodes``), so an
    assertion message can say which rule failed where.
    """
    from axe_playwright_python.sync_playwright import Axe

    axe = Axe()

    def run(page: Any, context: Any = None) -> list[dict[str, Any]]:
        # context: axe's include/exclude selectors ({"exclude": [[".x"]]}); None: all.
        found = axe.run(page, context=context).response["violations"]
        return [v for v in found if v.get("impact") in BLOCKING_IMPACTS]

    return run
