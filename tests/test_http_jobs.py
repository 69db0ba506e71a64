"""Scheduled HTTP calls against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from flask_defer import InvalidArgument, Job, JobStatus
from flask_defer.helpers.http_jobs import EXCERPT_CHARS, HTTP_JOB

from .conftest import AppKit


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Server:
    url: str
    received: list[Received] = field(default_factory=list)
    routes: dict[str, tuple[int, dict[str, str], bytes]] = field(
        default_factory=lambda: dict(ROUTES)
    )
    release: threading.Event = field(default_factory=threading.Event)


class Handler(BaseHTTPRequestHandler):
    server: Any

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        state: Server = self.server.state
        state.received.append(Received(self.command, self.path, dict(self.headers), body))
        path = self.path.split("?")[0]
        if path == "/hang":
            state.release.wait(20)
            return
        status, headers, payload = state.routes.get(path, (404, {}, b"no such route"))
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle


ROUTES: dict[str, tuple[int, dict[str, str], bytes]] = {
    "/ok": (200, {}, b"hello from the test server"),
    "/created": (201, {}, b""),
    "/fail": (500, {}, b"boom"),
    "/busy": (429, {"Retry-After": "120"}, b"slow down"),
    "/later": (503, {"Retry-After": "MOVED"}, b"maintenance"),
    "/timeout": (408, {}, b"request timeout"),
    "/missing": (404, {}, b"nope"),
    "/missing-page": (404, {}, b"<html>\n<body>\n<h1>Gone</h1>\n</body>\n</html>\n"),
    "/redirect": (302, {"Location": "http://example.invalid/elsewhere"}, b""),
    "/big": (200, {}, b"x" * 100_000),
}


@pytest.fixture
def server() -> Iterator[Server]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    state = Server(url=f"http://127.0.0.1:{httpd.server_address[1]}")
    httpd.state = state  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield state
    state.release.set()
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def later(seconds: float = 1) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


def run(kit: AppKit, job: Job, now: datetime | None = None) -> Job:
    kit.db.session.commit()
    kit.defer.run_due(now=now or later())
    ran = kit.defer.get(job.id)
    assert ran is not None
    return ran


def test_2xx_is_done_with_status_and_excerpt_recorded(kit: AppKit, server: Server) -> None:
    job = kit.defer.schedule_http(
        server.url + "/ok",
        json={"order": 7},
        headers={"X-Signature": "abc"},
        delay=60,
        key="hook:order:7",
    )
    assert job.name == HTTP_JOB and job.status is JobStatus.PENDING
    kit.db.session.commit()
    assert kit.defer.run_due(now=later(30)).ran == 0 and server.received == []

    done = run(kit, job, later(61))
    assert done.status is JobStatus.DONE
    assert done.result["status"] == 200 and done.result["reason"] == "OK"
    assert done.result["excerpt"] == "hello from the test server"
    assert isinstance(done.result["elapsed_ms"], int)
    [request] = server.received
    assert request.method == "POST" and request.path == "/ok"
    assert json.loads(request.body) == {"order": 7}
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["X-Signature"] == "abc"


def test_other_methods_and_empty_bodies(kit: AppKit, server: Server) -> None:
    job = kit.defer.schedule_http(server.url + "/created", method="put")
    assert run(kit, job).result["status"] == 201
    assert server.received[0].method == "PUT" and server.received[0].body == b""


def test_5xx_is_retried_with_backoff(kit: AppKit, server: Server) -> None:
    job = kit.defer.schedule_http(server.url + "/fail")
    now = later()
    retried = run(kit, job, now)
    assert retried.status is JobStatus.PENDING and retried.attempts == 1
    assert retried.run_at > now
    assert "HTTP 500" in retried.last_error and "boom" in retried.last_error


def test_429_honours_retry_after(kit: AppKit, server: Server) -> None:
    job = kit.defer.schedule_http(server.url + "/busy")
    now = later()
    retried = run(kit, job, now)
    assert retried.status is JobStatus.PENDING
    assert retried.run_at == now + timedelta(seconds=120)
    assert "HTTP 429" in retried.last_error and "slow down" in retried.last_error


def test_retry_after_as_an_http_date(kit: AppKit, server: Server) -> None:
    when = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=10)
    server.routes["/later"] = (503, {"Retry-After": format_datetime(when, usegmt=True)}, b"x")
    job = kit.defer.schedule_http(server.url + "/later")
    now = later()
    retried = run(kit, job, now)
    delay = (retried.run_at - now).total_seconds()
    assert 590 <= delay <= 600


def test_408_is_retried(kit: AppKit, server: Server) -> None:
    job = kit.defer.schedule_http(server.url + "/timeout")
    assert run(kit, job).status is JobStatus.PENDING


def test_4xx_fails_at_once_without_retries(kit: AppKit, server: Server) -> None:
    job = kit.defer.schedule_http(server.url + "/missing", method="GET")
    failed = run(kit, job)
    assert failed.status is JobStatus.FAILED and failed.attempts == 1
    assert failed.max_attempts > 1
    assert "HTTP 404" in failed.last_error and "nope" in failed.last_error


def test_a_4xx_with_a_multiline_body_is_summarised_by_its_status_line(
    kit: AppKit, server: Server
) -> None:
    from flask_defer.web.formatting import error_summary

    job = kit.defer.schedule_http(server.url + "/missing-page", method="GET")
    failed = run(kit, job)
    summary = error_summary(failed.last_error)
    assert "HTTP 404 Not Found" in summary, summary
    assert not summary.startswith("</html>")


def test_redirects_are_not_followed(kit: AppKit, server: Server) -> None:
    job = kit.defer.schedule_http(server.url + "/redirect", method="GET")
    failed = run(kit, job)
    assert failed.status is JobStatus.FAILED and "HTTP 302" in failed.last_error
    assert [r.path for r in server.received] == ["/redirect"]


def test_the_excerpt_is_bounded(kit: AppKit, server: Server) -> None:
    job = kit.defer.schedule_http(server.url + "/big", method="GET")
    excerpt = run(kit, job).result["excerpt"]
    assert len(excerpt) == EXCERPT_CHARS + 1 and excerpt.endswith("…")


def test_a_hanging_server_times_out_and_is_retried(kit: AppKit, server: Server) -> None:
    job = kit.defer.schedule_http(server.url + "/hang", timeout=0.5)
    started = time.monotonic()
    retried = run(kit, job)
    elapsed = time.monotonic() - started
    assert retried.status is JobStatus.PENDING and retried.attempts == 1
    assert "timed out" in retried.last_error
    assert elapsed < 5  # the 0.5 s timeout bounds the call, not the 20 s hang


def test_a_refused_connection_is_retried(kit: AppKit) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    job = kit.defer.schedule_http(f"http://127.0.0.1:{port}/nobody")
    retried = run(kit, job)
    assert retried.status is JobStatus.PENDING and "network error" in retried.last_error


def test_http_jobs_can_be_cancelled_and_rescheduled(kit: AppKit, server: Server) -> None:
    job = kit.defer.schedule_http(server.url + "/ok", delay=600, key="hook:1")
    kit.db.session.commit()
    moved = kit.defer.reschedule(key="hook:1", delay=30)
    assert moved.run_at < job.run_at
    assert kit.defer.cancel(key="hook:1") is True
    kit.defer.run_due(now=later(3600))
    assert server.received == []


def test_allowed_hosts_are_checked_when_scheduling(
    make_app: Callable[..., AppKit], server: Server
) -> None:
    kit = make_app(DEFER_HTTP_ALLOWED_HOSTS=["api.example.com", "*.hooks.example.org"])
    with kit.app.app_context():
        with pytest.raises(InvalidArgument) as raised:
            kit.defer.schedule_http(server.url + "/ok")
        assert raised.value.argument == "url" and "127.0.0.1" in str(raised.value)
        with pytest.raises(InvalidArgument):
            kit.defer.schedule_http("https://example.com/")
        with pytest.raises(InvalidArgument):
            kit.defer.schedule_http("https://evil-hooks.example.org/")
        kit.db.create_all()
        kit.defer.schedule_http("https://API.example.com/v1")
        kit.defer.schedule_http("https://a.b.hooks.example.org/x")
        kit.db.session.rollback()


def test_allowed_hosts_are_checked_again_when_running(
    make_app: Callable[..., AppKit], server: Server
) -> None:
    open_app = make_app()
    strict_app = make_app(DEFER_HTTP_ALLOWED_HOSTS=["api.example.com"])
    with open_app.app.app_context():
        open_app.db.create_all()
        job = open_app.defer.schedule_http(server.url + "/ok")
        open_app.db.session.commit()
    with strict_app.app.app_context():
        strict_app.defer.run_due(now=later())
        failed = strict_app.defer.get(job.id)
    assert failed.status is JobStatus.FAILED and "DEFER_HTTP_ALLOWED_HOSTS" in failed.last_error
    assert server.received == []


def test_schedule_http_refuses_bad_arguments(kit: AppKit) -> None:
    def refused(url: str = "https://api.example.com/", **options: Any) -> str:
        with pytest.raises(InvalidArgument) as raised:
            kit.defer.schedule_http(url, **options)
        return raised.value.argument

    assert refused("ftp://example.com/") == "url"
    assert refused("/relative") == "url"
    assert refused("https://example.com/a b") == "url"
    assert refused(method="BREW") == "method"
    assert refused(timeout=0) == "timeout"
    assert refused(timeout=11) == "timeout"  # above DEFER_HTTP_TIMEOUT (10 s)
    assert refused(headers={"X-A": "1\r\nX-B: 2"}) == "headers"
    assert refused(headers={"X A": "1"}) == "headers"
    assert refused(json={1, 2}) == "payload"
    assert refused(run_at=datetime(2030, 1, 1)) == "run_at"


def test_http_settings_are_validated(make_app: Callable[..., AppKit]) -> None:
    with pytest.raises(InvalidArgument) as raised:
        make_app(DEFER_HTTP_ALLOWED_HOSTS="api.example.com")
    assert raised.value.argument == "DEFER_HTTP_ALLOWED_HOSTS"
    with pytest.raises(InvalidArgument) as raised:
        make_app(DEFER_HTTP_TIMEOUT=0)
    assert raised.value.argument == "DEFER_HTTP_TIMEOUT"


def test_schedule_http_runs_against_the_per_app_state_without_a_defer(database_url: str) -> None:
    """The helper takes the app's state: its config decides, its registry knows the job."""
    import uuid

    from flask import Flask

    from flask_defer import InvalidArgument
    from flask_defer.helpers import http_jobs
    from flask_defer.registry import Registry
    from flask_defer.state import build_state

    registry = Registry()
    http_jobs.register(registry)
    app = Flask("http_helper_without_defer")
    app.config.update(
        DEFER_DATABASE_URI=database_url, DEFER_HTTP_ALLOWED_HOSTS=["api.example.com"]
    )
    state = build_state(app, registry=registry, table_name=f"defer_{uuid.uuid4().hex[:8]}")
    try:
        job = http_jobs.schedule_http(state, "https://api.example.com/hook", json_body={"a": 1})
        assert (job.name, job.payload["json"]) == (HTTP_JOB, {"a": 1})
        with pytest.raises(InvalidArgument, match="DEFER_HTTP_ALLOWED_HOSTS"):
            http_jobs.schedule_http(state, "https://evil.example.net/")
    finally:
        state.store.table.drop(state.store.engine)
        state.store.engine.dispose()
