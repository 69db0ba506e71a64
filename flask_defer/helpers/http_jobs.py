"""Scheduled HTTP calls: a built-in job that performs a request when it is due.

``defer.schedule_http("https://api.example.com/hook", json={...}, delay=3600)`` is an
ordinary job (cancel, reschedule and the dashboard work as for any job) whose handler
makes the request with the standard library. The answer decides the outcome:

* 2xx: done; the job's ``result`` records the status, reason, elapsed time and a
  bounded excerpt of the body;
* 408, 429 and 5xx, and network errors or timeouts: retried with the usual backoff,
  or after the ``Retry-After`` the server asked for (capped by ``DEFER_RETRY_CAP``);
* any other status (4xx, and 3xx: redirects are not followed, so an allow-list cannot
  be escaped through one): failed at once, with the status and excerpt in
  ``last_error``.

``DEFER_HTTP_ALLOWED_HOSTS`` restricts the hosts, checked when the call is scheduled
and again when it runs; ``DEFER_HTTP_TIMEOUT`` is the default and the upper bound of a
call's timeout. Headers are stored in the job's payload like any payload: keep secrets
out of them, or add them in a job of your own.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from ..config import DeferConfig
from ..errors import InvalidArgument
from ..jobs import Fail, Job, RetryAfter
from ..registry import HandlerSpec, Registry
from ..state import DeferState, current_state
from ..timeutil import Duration, as_duration

#: Name of the built-in job that performs a scheduled HTTP request.
HTTP_JOB = "flask_defer.http"

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

#: Characters of the response body kept on the job (result or last_error).
EXCERPT_CHARS = 1000
#: Bytes read from the response at most; the rest is never downloaded.
_READ_LIMIT = 4 * EXCERPT_CHARS

_RETRYABLE = frozenset({408, 429})
_USER_AGENT = "flask_defer"


class HttpCallFailed(Exception):  # noqa: N818 - reads as what happened
    """A scheduled HTTP call failed in a way that is worth retrying."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Do not follow redirects: the 3xx becomes the answer (and fails the job)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirects())


# -- scheduling --------------------------------------------------------------------


def schedule_http(
    state: DeferState,
    url: str,
    *,
    method: str = "POST",
    json_body: Any = None,
    headers: Mapping[str, str] | None = None,
    run_at: datetime | None = None,
    delay: Duration | None = None,
    key: str | None = None,
    timeout: Duration | None = None,
    replace: bool = False,
    owner: str | None = None,
    label: str | None = None,
) -> Job:
    """Schedule an HTTP request to *url*; joins ``db.session`` like ``defer.schedule``."""
    config = state.config
    check_url(url, config)
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise InvalidArgument("method", f"expected one of {', '.join(sorted(METHODS))}")
    payload: dict[str, Any] = {"url": url, "method": method.upper()}
    if headers is not None:
        payload["headers"] = _checked_headers(headers)
    if json_body is not None:
        payload["json"] = json_body
    if timeout is not None:
        limit = as_duration(timeout, "timeout", allow_zero=False)
        if limit > config.http_timeout:
            raise InvalidArgument(
                "timeout",
                f"at most DEFER_HTTP_TIMEOUT ({config.http_timeout.total_seconds():g} s)",
            )
        payload["timeout"] = limit.total_seconds()
    return state.schedule(
        HTTP_JOB,
        payload,
        run_at=run_at,
        delay=delay,
        key=key,
        replace=replace,
        owner=owner,
        label=label,
    )


def check_url(url: Any, config: DeferConfig) -> str:
    """Refuse URLs that are not http(s) or whose host is not allowed; return the host."""
    if not isinstance(url, str):
        raise InvalidArgument("url", f"expected a string, got {url!r}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgument("url", f"expected an http(s):// URL with a host, got {url!r}")
    if any(ch in url for ch in "\r\n\t "):
        raise InvalidArgument("url", "must not contain whitespace")
    host = parts.hostname.lower().rstrip(".")
    if not host_allowed(host, config.http_allowed_hosts):
        raise InvalidArgument(
            "url", f"host {host!r} is not in DEFER_HTTP_ALLOWED_HOSTS"
        )
    return host


def host_allowed(host: str, allowed: frozenset[str] | None) -> bool:
    """True if *host* is allowed: any host when *allowed* is None, else listed or a
    subdomain of a ``*.domain`` entry."""
    if allowed is None or host in allowed:
        return True
    return any(
        entry.startswith("*.") and host.endswith(entry[1:]) for entry in allowed
    )


def _checked_headers(headers: Any) -> dict[str, str]:
    if not isinstance(headers, Mapping):
        raise InvalidArgument("headers", f"expected a mapping of strings, got {headers!r}")
    checked: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidArgument("headers", f"names and values must be strings: {name!r}")
        if not name or any(ch in name for ch in "\r\n: ") or any(ch in value for ch in "\r\n"):
            raise InvalidArgument("headers", f"invalid header {name!r}")
        checked[name] = value
    return checked


# -- running -----------------------------------------------------------------------


def perform(job: Job, config: DeferConfig) -> dict[str, Any]:
    """Make the request of an HTTP job and turn the answer into its outcome."""
    payload = job.payload
    url = payload["url"]
    try:
        check_url(url, config)
    except InvalidArgument as refused:
        # The allow-list may have changed since the call was scheduled.
        raise Fail(str(refused)) from None
    method = payload.get("method", "POST")
    timeout = min(float(payload.get("timeout", 1e9)), config.http_timeout.total_seconds())
    headers = {"User-Agent": _USER_AGENT}
    data = None
    if "json" in payload:
        data = json.dumps(payload["json"]).encode()
        headers["Content-Type"] = "application/json"
    headers.update(payload.get("headers") or {})
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    started = time.monotonic()
    try:
        response = _opener.open(request, timeout=timeout)
    except urllib.error.HTTPError as answer:
        response = answer  # a non-2xx answer is still an answer: read it below
    except (OSError, http.client.HTTPException) as error:
        raise HttpCallFailed(f"{method} {url}: network error: {error}") from error
    try:
        status = int(getattr(response, "status", None) or response.code)
        reason = str(getattr(response, "reason", "") or "")
        retry_after = response.headers.get("Retry-After")
        excerpt = _read_excerpt(response, deadline=started + timeout)
    except (OSError, http.client.HTTPException) as error:
        raise HttpCallFailed(f"{method} {url}: reading the response failed: {error}") from error
    finally:
        response.close()
    result = {
        "status": status,
        "reason": reason,
        "excerpt": excerpt,
        "elapsed_ms": round((time.monotonic() - started) * 1000),
    }
    if 200 <= status < 300:
        return result
    # One line: an error's summary is the last line of its traceback, which must say
    # "HTTP 404 Not Found", not end on the tail of a multi-line HTML body.
    body = " ".join(excerpt.split())
    summary = f"{method} {url}: HTTP {status} {reason}: {body}".rstrip(": ")
    if status in _RETRYABLE or status >= 500:
        wait = _retry_after(retry_after, cap=config.retry_cap)
        if wait is not None:
            raise RetryAfter(wait, summary)
        raise HttpCallFailed(summary)
    raise Fail(summary)


def _read_excerpt(response: Any, *, deadline: float) -> str:
    """Up to EXCERPT_CHARS of the body, read within *deadline* (a trickle cannot hold on)."""
    chunks: list[bytes] = []
    size = 0
    while size < _READ_LIMIT:
        if time.monotonic() > deadline:
            raise TimeoutError("the response body did not arrive within the timeout")
        # Small reads: each waits at most the socket timeout, then the deadline is checked.
        chunk = response.read(min(512, _READ_LIMIT - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    text = b"".join(chunks).decode("utf-8", errors="replace")
    if len(text) > EXCERPT_CHARS or size >= _READ_LIMIT:
        return text[:EXCERPT_CHARS] + "…"
    return text


def _retry_after(value: str | None, *, cap: timedelta) -> timedelta | None:
    """The delay a ``Retry-After`` header asks for (seconds or an HTTP date), capped."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        delay = timedelta(seconds=int(value))
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        delay = max(when - datetime.now(UTC), timedelta(0))
    return min(delay, cap)


def register(registry: Registry) -> None:
    """Register the built-in HTTP handler; it reads its app's config when it runs."""

    def call(job: Job) -> dict[str, Any]:
        return perform(job, current_state().config)

    registry.add(HandlerSpec(name=HTTP_JOB, func=call))
