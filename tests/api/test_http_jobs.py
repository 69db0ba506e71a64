"""Scheduled HTTP calls against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import base64
import email.message
import json
import logging
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from flask_defer import InvalidArgument, Job, JobStatus, secret
from flask_defer.features import http_guard, http_signing, http_transport
from flask_defer.features.http_jobs import EXCERPT_CHARS, HTTP_JOB

from ..conftest import AppKit


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    #: Every header line as sent, repeated names included.
    lines: list[tuple[str, str]] = field(default_factory=list)


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
        state.received.append(
            Received(self.command, self.path, dict(self.headers), body, list(self.headers.items()))
        )
        path = self.path.split("?")[0]
        if path == "/hang":
            state.release.wait(20)
            return
        if path.startswith("/echo"):  # a receiver that shows the request it got
            self._echo(path)
            return
        status, headers, payload = state.routes.get(path, (404, {}, b"no such route"))
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _echo(self, path: str) -> None:
        as_json = path.endswith("-json")
        if as_json:
            payload = json.dumps(dict(self.headers)).encode()
        else:
            payload = "".join(f"{k}: {v}\n" for k, v in self.headers.items()).encode()
        self.send_response(200 if "-ok" in path else 503)
        self.send_header("Content-Type", "application/json" if as_json else "text/plain")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
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
    "/error-page": (
        500,
        {"Content-Type": "text/html; charset=utf-8"},
        b"<html><head><title>500 Internal Server Error</title><style>body{color:red}</style>"
        b"</head><body><h1>Internal&nbsp;Server Error</h1>\n<pre>"
        + b"Traceback line\n" * 5000
        + b"</pre></body></html>",
    ),
    "/image": (200, {"Content-Type": "image/png"}, b"\x89PNG\r\n\x1a\n\x00\x00" + b"\x01" * 90),
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


#: The test server listens on loopback, which calls refuse unless allowed (SSRF).
LOOPBACK = ["127.0.0.1/32", "::1/128"]


@pytest.fixture
def kit(make_app: Callable[..., AppKit]) -> Iterator[AppKit]:
    """An app whose HTTP calls may reach the loopback test server, context pushed."""
    kit = make_app(DEFER_HTTP_ALLOWED_NETWORKS=LOOPBACK)
    with kit.app.app_context():
        kit.db.create_all()
        yield kit
        kit.db.session.rollback()


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


def test_a_calls_own_header_in_any_case_replaces_the_default_not_doubles_it(
    kit: AppKit, server: Server
) -> None:
    job = kit.defer.schedule_http(
        server.url + "/ok",
        json={"order": 7},
        headers={"content-type": "application/vnd.shop+json", "user-agent": "shop/1.2"},
    )
    assert run(kit, job).status is JobStatus.DONE
    [request] = server.received
    sent = [(name.lower(), value) for name, value in request.lines]
    assert [v for n, v in sent if n == "content-type"] == ["application/vnd.shop+json"]
    assert [v for n, v in sent if n == "user-agent"] == ["shop/1.2"]
    assert len([n for n, _ in sent if n == "idempotency-key"]) == 1


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
    open_app = make_app(DEFER_HTTP_ALLOWED_NETWORKS=LOOPBACK)
    strict_app = make_app(
        DEFER_HTTP_ALLOWED_HOSTS=["api.example.com"], DEFER_HTTP_ALLOWED_NETWORKS=LOOPBACK
    )
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
    assert refused(json={1, 2}) == "json"
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
    from flask_defer.features import http_jobs
    from flask_defer.operations.assembly import build_state
    from flask_defer.registry import Registry

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


# -- idempotency ---------------------------------------------------------------------


def test_every_attempt_of_a_job_sends_the_same_idempotency_key(
    kit: AppKit, server: Server
) -> None:
    job = kit.defer.schedule_http(server.url + "/flaky", json={"order": 7})
    other = kit.defer.schedule_http(server.url + "/ok", json={"order": 8})
    server.routes["/flaky"] = (503, {}, b"try again")
    assert run(kit, job).status is JobStatus.PENDING
    server.routes["/flaky"] = (200, {}, b"ok")
    assert run(kit, job, later(3600)).status is JobStatus.DONE

    flaky = [r.headers["Idempotency-Key"] for r in server.received if r.path == "/flaky"]
    [second] = [r.headers["Idempotency-Key"] for r in server.received if r.path == "/ok"]
    assert len(flaky) == 2 and flaky[0] == flaky[1] == job.payload["id"]
    assert second == other.payload["id"] != flaky[0]


def test_an_idempotency_key_of_the_callers_is_sent_on_every_attempt(
    kit: AppKit, server: Server
) -> None:
    job = kit.defer.schedule_http(server.url + "/ok", idempotency_key="order-7-shipped")
    run(kit, job)
    assert server.received[0].headers["Idempotency-Key"] == "order-7-shipped"
    for bad in ("", "two words", "x" * 256, "line\nbreak", 7):
        with pytest.raises(InvalidArgument) as raised:
            kit.defer.schedule_http(server.url + "/ok", idempotency_key=bad)  # type: ignore[arg-type]
        assert raised.value.argument == "idempotency_key"
    with pytest.raises(InvalidArgument, match="idempotency_key="):
        kit.defer.schedule_http(server.url + "/ok", headers={"idempotency-key": "mine"})


# -- Standard Webhooks signing -------------------------------------------------------

CURRENT = "whsec_" + base64.b64encode(b"c" * 32).decode()
NEXT = "whsec_" + base64.b64encode(b"n" * 32).decode()
STRANGER = "whsec_" + base64.b64encode(b"s" * 32).decode()


@pytest.fixture
def signing(make_app: Callable[..., AppKit]) -> Callable[..., AppKit]:
    """Factory: an app reaching the loopback server with these webhook secrets."""

    def build(secrets: dict[str, Any], **config: Any) -> AppKit:
        made = make_app(
            DEFER_HTTP_ALLOWED_NETWORKS=LOOPBACK, DEFER_WEBHOOK_SECRETS=secrets, **config
        )
        with made.app.app_context():
            made.db.create_all()
        return made

    return build


def test_a_signed_call_verifies_with_the_standardwebhooks_library_on_every_attempt(
    signing: Callable[..., AppKit], server: Server
) -> None:
    kit = signing({"billing": CURRENT})
    server.routes["/hook"] = (500, {}, b"down")
    with kit.app.app_context():
        job = kit.defer.schedule_http(server.url + "/hook", json={"invoice": 12}, sign="billing")
        assert run(kit, job).status is JobStatus.PENDING
        server.routes["/hook"] = (204, {}, b"")
        assert run(kit, job, later(3600)).status is JobStatus.DONE
    first, second = server.received
    for request in (first, second):
        assert Webhook(CURRENT).verify(request.body, request.headers) == {"invoice": 12}
        with pytest.raises(WebhookVerificationError):
            Webhook(STRANGER).verify(request.body, request.headers)
        assert request.headers["webhook-signature"].startswith("v1,")
        assert " " not in request.headers["webhook-signature"]  # one key, one signature
    # One message, delivered twice: the id is the job's; each attempt has its own time.
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == job.payload["id"]
    assert first.headers["webhook-id"] == first.headers["Idempotency-Key"]
    assert abs(int(first.headers["webhook-timestamp"]) - time.time()) < 60
    # The body is signed as sent: a byte changed fails verification.
    with pytest.raises(WebhookVerificationError):
        Webhook(CURRENT).verify(first.body.replace(b"12", b"13"), first.headers)


def test_while_rotating_a_call_carries_a_signature_for_each_secret(
    signing: Callable[..., AppKit], server: Server
) -> None:
    kit = signing({"billing": [CURRENT, NEXT]})
    with kit.app.app_context():
        run(kit, kit.defer.schedule_http(server.url + "/ok", json=[1, 2], sign="billing"))
    [request] = server.received
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    assert Webhook(CURRENT).verify(request.body, request.headers) == [1, 2]
    assert Webhook(NEXT).verify(request.body, request.headers) == [1, 2]
    with pytest.raises(WebhookVerificationError):
        Webhook(STRANGER).verify(request.body, request.headers)


def test_signing_secrets_come_from_the_config_of_the_worker_and_are_not_stored(
    signing: Callable[..., AppKit], server: Server
) -> None:
    before = signing({"billing": CURRENT})
    after = signing({"billing": NEXT})  # the secret rotated between scheduling and running
    with before.app.app_context():
        job = before.defer.schedule_http(server.url + "/ok", json={"a": 1}, sign="billing")
        before.db.session.commit()
    with after.app.app_context():
        assert run(after, job).status is JobStatus.DONE
        stored = stored_text(after, job.id)
    [request] = server.received
    Webhook(NEXT).verify(request.body, request.headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(CURRENT).verify(request.body, request.headers)
    assert "'sign': 'billing'" in stored
    for secret_text in (CURRENT, NEXT, CURRENT.removeprefix("whsec_")):
        assert secret_text not in stored


def test_a_signing_secret_missing_when_the_call_runs_fails_it_without_sending(
    signing: Callable[..., AppKit], server: Server
) -> None:
    before = signing({"billing": CURRENT})
    after = signing({"crm": NEXT})
    with before.app.app_context():
        job = before.defer.schedule_http(server.url + "/ok", sign="billing")
        before.db.session.commit()
    with after.app.app_context():
        failed = run(after, job)
        with pytest.raises(InvalidArgument) as raised:
            after.defer.schedule_http(server.url + "/ok", sign="billing")
    assert raised.value.argument == "sign" and "DEFER_WEBHOOK_SECRETS" in str(raised.value)
    assert failed.status is JobStatus.FAILED and failed.attempts == 1
    assert "'billing'" in failed.last_error and "DEFER_WEBHOOK_SECRETS" in failed.last_error
    assert server.received == []


# -- header secrets ------------------------------------------------------------------


def test_a_header_secret_is_looked_up_by_name_when_the_call_runs(
    make_app: Callable[..., AppKit], server: Server
) -> None:
    before = make_app(
        DEFER_HTTP_ALLOWED_NETWORKS=LOOPBACK, DEFER_HTTP_SECRETS={"billing_token": "Bearer old"}
    )
    after = make_app(
        DEFER_HTTP_ALLOWED_NETWORKS=LOOPBACK, DEFER_HTTP_SECRETS={"billing_token": "Bearer new"}
    )
    with before.app.app_context():
        before.db.create_all()
        job = before.defer.schedule_http(
            server.url + "/ok", headers={"Authorization": secret("billing_token"), "X-A": "1"}
        )
        before.db.session.commit()
    with after.app.app_context():
        assert run(after, job).status is JobStatus.DONE
        stored = stored_text(after, job.id)
    [request] = server.received
    assert request.headers["Authorization"] == "Bearer new" and request.headers["X-A"] == "1"
    assert "billing_token" in stored
    assert "Bearer old" not in stored and "Bearer new" not in stored


def test_a_header_secret_missing_when_the_call_runs_fails_it_clearly(
    make_app: Callable[..., AppKit], server: Server
) -> None:
    before = make_app(
        DEFER_HTTP_ALLOWED_NETWORKS=LOOPBACK, DEFER_HTTP_SECRETS={"billing_token": "Bearer x"}
    )
    after = make_app(DEFER_HTTP_ALLOWED_NETWORKS=LOOPBACK)
    with before.app.app_context():
        before.db.create_all()
        job = before.defer.schedule_http(
            server.url + "/ok", headers={"Authorization": secret("billing_token")}
        )
        before.db.session.commit()
    with after.app.app_context():
        failed = run(after, job)
        with pytest.raises(InvalidArgument) as raised:
            after.defer.schedule_http(
                server.url + "/ok", headers={"Authorization": secret("billing_token")}
            )
    assert raised.value.argument == "headers" and "DEFER_HTTP_SECRETS" in str(raised.value)
    assert failed.status is JobStatus.FAILED and failed.attempts == 1
    assert "'billing_token'" in failed.last_error and "DEFER_HTTP_SECRETS" in failed.last_error
    assert "'Authorization'" in failed.last_error
    assert server.received == []


def test_a_secret_name_must_be_a_plain_name(kit: AppKit) -> None:
    for bad in ("", "two words", "a/b", None):
        with pytest.raises(InvalidArgument) as raised:
            secret(bad)  # type: ignore[arg-type]
        assert raised.value.argument == "name"


def stored_text(kit: AppKit, job_id: int) -> str:
    """Everything the database holds about *job_id*: its row and its history, as text."""
    store = kit.defer.store
    with store.engine.connect() as conn:
        row = conn.execute(select(store.table).where(store.table.c.id == job_id)).one()
        events = conn.execute(
            select(store.history_table).where(store.history_table.c.job_id == job_id)
        ).all()
    return repr(tuple(row)) + repr([tuple(event) for event in events])


# -- SSRF: only public addresses, unless allowed --------------------------------------


@dataclass
class Connections:
    """Every connection attempt the test process made through the socket module."""

    attempts: list[str] = field(default_factory=list)


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> Connections:
    """Record every outgoing connection; refuse any to an address but the loopback
    test server's, so a broken check cannot send traffic anywhere else."""
    seen = Connections()
    real = socket.create_connection

    def guarded(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        seen.attempts.append(address[0])
        if address[0] not in ("127.0.0.1", "::1"):
            raise AssertionError(f"the test tried to connect to {address[0]}")
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", guarded)
    return seen


def test_non_public_addresses_are_refused_when_the_call_runs_before_any_connection(
    make_app: Callable[..., AppKit], server: Server, connections: Connections
) -> None:
    port = server.url.rsplit(":", 1)[1]
    refused = {
        f"http://127.0.0.1:{port}/ok": "127.0.0.1 is a loopback address",
        f"http://[::1]:{port}/ok": "::1 is a loopback address",
        f"http://localhost:{port}/ok": "localhost resolves to ",
        "http://10.1.2.3/": "10.1.2.3 is a private address",
        "http://169.254.169.254/latest/meta-data/": "169.254.169.254 is a link-local address",
        "http://0.0.0.0/": "0.0.0.0 is an unspecified address",
        f"http://[::ffff:127.0.0.1]:{port}/ok": "a loopback address (IPv4 inside IPv6)",
        "http://[fd12:3456::1]/": "fd12:3456::1 is a private address",
        "http://[fe80::1]/": "fe80::1 is a link-local address",
        "http://224.0.0.1/": "224.0.0.1 is a multicast address",
        "http://100.64.0.1/": "100.64.0.1 is a non-public address",
        "http://240.0.0.1/": "240.0.0.1 is a reserved address",
        "http://[64:ff9b::a00:1]/": "a private address (IPv4 inside IPv6)",
    }
    # Scheduled where everything is allowed, run where nothing private is.
    anywhere = make_app(DEFER_HTTP_ALLOWED_NETWORKS=["0.0.0.0/0", "::/0"])
    strict = make_app()
    with anywhere.app.app_context():
        anywhere.db.create_all()
        jobs = {url: anywhere.defer.schedule_http(url, method="GET") for url in refused}
        anywhere.db.session.commit()
    with strict.app.app_context():
        strict.defer.run_due(now=later())
        for url, reason in refused.items():
            failed = strict.defer.get(jobs[url].id)
            assert failed is not None and failed.status is JobStatus.FAILED, url
            assert failed.attempts == 1 and reason in failed.last_error, failed.last_error
            assert "DEFER_HTTP_ALLOWED_NETWORKS" in failed.last_error
    assert connections.attempts == [] and server.received == []


def test_a_private_address_literal_is_refused_when_scheduling(kit: AppKit) -> None:
    for url in ("http://10.0.0.1/", "http://[fd00::1]:8080/", "https://169.254.169.254/"):
        with pytest.raises(InvalidArgument) as raised:
            kit.defer.schedule_http(url)
        assert raised.value.argument == "url" and "DEFER_HTTP_ALLOWED_NETWORKS" in str(
            raised.value
        )
    # Loopback is allowed in this module's app: the setting decides, per network.
    kit.defer.schedule_http("http://127.0.0.1:9/")


def test_allowed_networks_open_only_the_networks_listed(
    make_app: Callable[..., AppKit], server: Server, connections: Connections
) -> None:
    only_v4 = make_app(DEFER_HTTP_ALLOWED_NETWORKS=["127.0.0.1/32"])
    port = server.url.rsplit(":", 1)[1]
    with only_v4.app.app_context():
        only_v4.db.create_all()
        assert run(only_v4, only_v4.defer.schedule_http(server.url + "/ok")).status is (
            JobStatus.DONE
        )
        with pytest.raises(InvalidArgument, match="::1 is a loopback address"):
            only_v4.defer.schedule_http(f"http://[::1]:{port}/ok")
    assert connections.attempts == ["127.0.0.1"]


def test_the_connection_goes_to_the_address_checked_not_to_a_second_dns_answer(
    kit: AppKit, server: Server, connections: Connections, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebinding DNS answers a public-looking check first and a private address next;
    the call resolves once and connects to the address it checked."""
    port = int(server.url.rsplit(":", 1)[1])
    answers = iter(["127.0.0.1", "10.0.0.1", "10.0.0.1"])
    asked: list[str] = []

    def rebinding(host: str, *args: Any, **kwargs: Any) -> list[Any]:
        asked.append(host)
        address = next(answers)
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))]

    monkeypatch.setattr(http_guard, "getaddrinfo", rebinding)
    job = kit.defer.schedule_http(f"http://hooks.rebind.test:{port}/ok", method="GET")
    assert run(kit, job).status is JobStatus.DONE
    assert asked == ["hooks.rebind.test"] and connections.attempts == ["127.0.0.1"]
    [request] = server.received
    assert request.headers["Host"] == f"hooks.rebind.test:{port}"  # the name, not the IP


def test_a_name_resolving_to_any_refused_address_is_refused_entirely(
    kit: AppKit, server: Server, connections: Connections, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = int(server.url.rsplit(":", 1)[1])

    def mixed(host: str, *args: Any, **kwargs: Any) -> list[Any]:
        return [
            (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))
            for address in ("127.0.0.1", "10.0.0.1")
        ]

    monkeypatch.setattr(http_guard, "getaddrinfo", mixed)
    failed = run(kit, kit.defer.schedule_http(f"http://mixed.test:{port}/ok"))
    assert failed.status is JobStatus.FAILED
    assert "mixed.test resolves to 10.0.0.1, a private address" in failed.last_error
    assert connections.attempts == [] and server.received == []


def test_a_name_that_does_not_resolve_is_retried(kit: AppKit, connections: Connections) -> None:
    retried = run(kit, kit.defer.schedule_http("http://no-such-host.invalid/hook"))
    assert retried.status is JobStatus.PENDING and "cannot resolve the host" in retried.last_error
    assert connections.attempts == []


# -- the answer: status and a bounded text excerpt -------------------------------------


def test_a_failed_attempt_records_status_and_a_text_excerpt_in_last_error_and_history(
    kit: AppKit, server: Server
) -> None:
    job = kit.defer.schedule_http(server.url + "/error-page", json={"a": 1})
    retried = run(kit, job)
    message = retried.last_error.strip().splitlines()[-1]
    assert message.startswith(
        "flask_defer.features.http_jobs.HttpCallFailed: HTTP 500 Internal Server Error from POST "
        f"{server.url}/error-page: 500 Internal Server Error Internal Server Error Traceback line"
    ), message
    assert "<" not in message and "body{color" not in message  # visible text only
    assert message.endswith("…") and len(message) < EXCERPT_CHARS + 200
    [event] = [e for e in kit.defer.history(job.id) if e.event == "retried"]
    assert event.error == retried.last_error


def test_the_worker_log_line_of_an_http_failure_is_short_and_starts_with_the_status(
    kit: AppKit, server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    job = kit.defer.schedule_http(server.url + "/error-page")
    with caplog.at_level(logging.WARNING, logger="flask_defer"):
        run(kit, job)
    [line] = [r.getMessage() for r in caplog.records if "attempt 1 failed" in r.getMessage()]
    assert re.search(
        r"retrying at \S+ \S+: HttpCallFailed: HTTP 500 Internal Server Error from POST ", line
    )
    assert len(line) < EXCERPT_CHARS + 200 and "<html" not in line


def test_a_binary_body_is_described_not_shown(kit: AppKit, server: Server) -> None:
    done = run(kit, kit.defer.schedule_http(server.url + "/image", method="GET"))
    assert done.result["excerpt"] == "[100 bytes of image/png]"


# -- HTTPS to the checked address ----------------------------------------------------

#: A test-only CA and a certificate it signed for hooks.example.test (valid to 2126),
#: made with openssl for these tests; the name resolves only through the test's answer.
TLS = Path(__file__).parent.parent / "fixtures" / "tls"


@pytest.fixture
def tls_server() -> Iterator[Server]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(TLS / "server.pem", TLS / "server.key")
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    state = Server(url=f"https://hooks.example.test:{httpd.server_address[1]}")
    httpd.state = state  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield state
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def test_https_goes_to_the_checked_address_and_verifies_the_certificate_of_the_url_host(
    kit: AppKit,
    tls_server: Server,
    connections: Connections,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def hooks_on_loopback(host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        assert host == "hooks.example.test"
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", port))]

    monkeypatch.setattr(http_guard, "getaddrinfo", hooks_on_loopback)
    # Trusting the test CA: the certificate names the URL's host, not 127.0.0.1, so the
    # call only succeeds if TLS checks the name while the socket goes to the address.
    monkeypatch.setenv("SSL_CERT_FILE", str(TLS / "ca.pem"))
    monkeypatch.setattr(http_transport, "_tls", None)
    done = run(kit, kit.defer.schedule_http(tls_server.url + "/ok", json={"a": 1}))
    assert done.status is JobStatus.DONE and done.result["excerpt"] == (
        "hello from the test server"
    )
    [request] = tls_server.received
    assert request.headers["Host"] == tls_server.url.removeprefix("https://")

    # Without the CA the certificate is not trusted: the call is retried, not sent blind.
    monkeypatch.delenv("SSL_CERT_FILE")
    monkeypatch.setattr(http_transport, "_tls", None)
    retried = run(kit, kit.defer.schedule_http(tls_server.url + "/ok"))
    assert retried.status is JobStatus.PENDING
    assert "CERTIFICATE_VERIFY_FAILED" in retried.last_error
    assert len(tls_server.received) == 1 and set(connections.attempts) == {"127.0.0.1"}


# -- hostile requests: smuggling, unsendable input, the internal job, echoed secrets ----


def refused_argument(kit: AppKit, url: str = "https://api.example.com/", **options: Any) -> str:
    """The argument ``schedule_http`` names when it refuses the call."""
    with pytest.raises(InvalidArgument) as raised:
        kit.defer.schedule_http(url, **options)
    return raised.value.argument


@pytest.mark.parametrize(
    "name",
    [
        "Host\t", "\tHost", "Transfer-Encoding\t", "Content-Length\t", "Idempotency-Key\t",
        "Host\x0b", "X-A\x00", "X A", "X:A", "X-Ä", "X-A\u2028", "", "X-A\r",
        "Host", "TE", "Expect", "Upgrade", "Keep-Alive",
    ],
)  # fmt: skip
def test_a_header_name_that_is_not_a_token_or_is_reserved_is_refused(
    kit: AppKit, name: str
) -> None:
    assert refused_argument(kit, headers={name: "evil"}) == "headers"


@pytest.mark.parametrize(
    "value",
    ["a\x0bb", "a\x0cb", "a\x00b", "café", "a\u2028b", "a\rb", "a\nb", " lead", "trail\t"],
)
def test_a_header_value_that_is_not_visible_ascii_is_refused(kit: AppKit, value: str) -> None:
    assert refused_argument(kit, headers={"X-Note": value}) == "headers"


def test_the_same_header_twice_in_other_cases_is_refused(kit: AppKit) -> None:
    assert refused_argument(kit, headers={"X-A": "1", "x-a": "2"}) == "headers"


def test_a_control_character_is_refused_naming_the_argument_the_caller_passed(
    kit: AppKit,
) -> None:
    assert refused_argument(kit, "https://api.example.com/a\x00b") == "url"
    assert refused_argument(kit, "https://api.example.com/a\u2028b") == "url"
    assert refused_argument(kit, "https://api.example.com/\x7f") == "url"
    assert refused_argument(kit, headers={"X-A": "a\x00b"}) == "headers"
    assert refused_argument(kit, json={"text": "a\x00b"}) == "json"
    assert refused_argument(kit, json={"n": float("nan")}) == "json"


def test_a_secret_that_is_not_a_valid_header_value_is_refused_at_init_app(
    make_app: Callable[..., AppKit],
) -> None:
    for bad in ("Bearer \x0bx", "Bearer é", "Bearer x\n", ""):
        with pytest.raises(InvalidArgument) as raised:
            make_app(DEFER_HTTP_SECRETS={"token": bad})
        assert raised.value.argument == "DEFER_HTTP_SECRETS['token']"
        assert bad not in str(raised.value) or bad == ""


def test_a_non_ascii_url_is_sent_percent_encoded_as_browsers_do(
    kit: AppKit, server: Server
) -> None:
    job = kit.defer.schedule_http(server.url + "/café?q=ü", method="GET")
    assert job.payload["url"] == server.url + "/caf%C3%A9?q=%C3%BC"
    run(kit, job)
    [request] = server.received
    assert request.path == "/caf%C3%A9?q=%C3%BC"


def test_a_non_ascii_host_is_stored_in_its_idna_form(kit: AppKit) -> None:
    job = kit.defer.schedule_http("https://bücher.example/a", delay=3600)
    assert job.payload["url"] == "https://xn--bcher-kva.example/a"
    assert refused_argument(kit, "https://a..b\u00e9/") == "url"  # no valid IDNA form


def direct(kit: AppKit, payload: dict[str, Any]) -> Job:
    """The internal job scheduled as ``defer.schedule`` allows, around schedule_http."""
    job = kit.defer.schedule(HTTP_JOB, payload)
    kit.db.session.commit()
    return job


@pytest.mark.parametrize(
    "payload",
    [
        {"method": "PROPFIND"},
        {"headers": {"Host": "169.254.169.254"}},
        {"headers": {"Transfer-Encoding": "chunked"}},
        {"headers": {"Host\t": "evil"}},
        {"headers": {"X-A": "caf\u00e9"}},
        {"headers": {"X-A": "a\u2028b"}},
        {"headers": "X-A: 1"},
        {"secret_headers": {"Authorization": "not configured"}},
        {"secret_headers": {"Content-Length": "token"}},
        {"sign": "nobody"},
        {"timeout": 3600},
        {"id": "has a space"},
        {"proxy": "http://elsewhere"},
    ],
    ids=lambda payload: repr(payload)[:40],
)
def test_the_internal_job_scheduled_directly_gets_every_check_before_sending(
    kit: AppKit, server: Server, payload: dict[str, Any]
) -> None:
    job = direct(kit, {"url": server.url + "/ok", "method": "POST", **payload})
    failed = run(kit, job)
    assert failed.status is JobStatus.FAILED and failed.attempts == 1, failed.last_error
    assert "refused the" in failed.last_error
    assert server.received == []


def test_a_secret_echoed_by_the_receiver_is_stored_nowhere(
    make_app: Callable[..., AppKit], server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    token = "Bearer sk_live_51Hx9supersecretvalue"
    kit = make_app(
        DEFER_HTTP_ALLOWED_NETWORKS=LOOPBACK,
        DEFER_HTTP_SECRETS={"tok": token},
        DEFER_WEBHOOK_SECRETS={"hook": CURRENT},
    )
    with kit.app.app_context(), caplog.at_level(logging.INFO, logger="flask_defer"):
        kit.db.create_all()
        jobs = [
            kit.defer.schedule_http(
                server.url + path, headers={"Authorization": secret("tok")}, sign="hook"
            )
            for path in ("/echo", "/echo-json", "/echo-ok", "/echo-ok-json")
        ]
        kit.db.session.commit()
        kit.defer.run_due(now=later())
        stored = "".join(stored_text(kit, job.id) for job in jobs)
    sent = server.received[0].headers
    assert sent["Authorization"] == token  # the receiver got it, and echoed it
    signature = sent["webhook-signature"]
    logged = caplog.text
    for leaked in (token, "sk_live_51Hx9supersecretvalue", signature, signature[3:]):
        assert leaked not in stored and leaked not in logged, leaked
    assert "[redacted]" in stored and "HTTP 503" in stored


def test_a_secret_cut_by_the_read_limit_leaves_no_prefix(kit: AppKit) -> None:
    redact = http_signing.Redactor(["sk_live_51Hx9supersecretvalue"])
    raw = b"x" * 100 + b"sk_live_51Hx9sup"
    headers = email.message.Message()
    headers["Content-Type"] = "text/plain"
    text = http_transport.excerpt(raw, headers, truncated=True, redact=redact)
    assert "sk_live" not in text and "[redacted]" in text
