"""Scheduled HTTP calls: a built-in job that performs a request when it is due.

``defer.schedule_http("https://api.example.com/hook", json={...}, delay=3600)`` is an
ordinary job (cancel, reschedule and the dashboard work as for any job) whose handler
makes the request with the standard library. The answer decides the outcome:

* 2xx: done; the job's ``result`` records the status, reason, elapsed time and a
  bounded text excerpt of the body;
* 408, 429 and 5xx, and network errors or timeouts: retried with the usual backoff,
  or after the ``Retry-After`` the server asked for (capped by ``DEFER_RETRY_CAP``);
* any other status (4xx, and 3xx: redirects are not followed, so an address check
  cannot be escaped through one): failed at once.

A failure's message starts with the status ("HTTP 503 Service Unavailable from POST
https://...: <excerpt>") and is what ``last_error``, the history's retried or failed
event and the worker's log line carry, bounded by the excerpt's length.

What a call may send is checked by :mod:`.http_checks`, when it is scheduled and
again before it is sent. Every attempt of a job sends the same ``Idempotency-Key``
(and, when signed, the same ``webhook-id``), drawn when the call is scheduled, so a
receiver can tell a retry from a new call. Secrets are named, not stored
(:mod:`.http_signing`); the host is resolved when the call runs and only public
addresses, or those in ``DEFER_HTTP_ALLOWED_NETWORKS``, are connected to
(:mod:`.http_guard`); ``DEFER_HTTP_ALLOWED_HOSTS`` restricts the host names, checked
when the call is scheduled and again when it runs; ``DEFER_HTTP_TIMEOUT`` is the
default and the upper bound of a call's timeout.
"""

from __future__ import annotations

import email.utils
import http.client
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Unpack

from ..config import DeferConfig
from ..errors import InvalidArgument
from ..jobs import Fail, Job, RetryAfter
from ..operations import scheduling
from ..operations.scheduling import ScheduleOptions
from ..operations.state import DeferState, current_state
from ..registry import HandlerSpec, Registry
from ..timeutil import Duration
from ..validation import payload_text
from . import http_guard, http_signing, http_transport
from .http_checks import (
    METHODS,
    check_headers,
    check_url,
    checked_id,
    checked_method,
    checked_request,
    checked_sign,
    checked_timeout,
)
from .http_signing import Redactor, Secret, SecretMissing
from .http_transport import EXCERPT_CHARS

__all__ = [
    "EXCERPT_CHARS", "HTTP_JOB", "METHODS", "HttpCallFailed", "check_url", "schedule_http",
    "shown_payload",
]  # fmt: skip

#: Name of the built-in job that performs a scheduled HTTP request.
HTTP_JOB = "flask_defer.http"

#: Headers whose plain values are credentials: the dashboard never shows them.
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
#: What the dashboard shows instead of a credential or a query string.
HIDDEN = "(hidden)"

_RETRYABLE = frozenset({408, 429})
_USER_AGENT = "flask_defer"


class HttpCallFailed(Exception):  # noqa: N818 - reads as what happened
    """A scheduled HTTP call failed in a way that is worth retrying."""


def shown_payload(name: str, payload: Any) -> Any:
    """*payload* as the dashboard shows it: for a scheduled HTTP call, without the values
    of credential headers passed as plain text (``Authorization``, ``Proxy-Authorization``,
    ``Cookie``) or the URL's query string, which may hold a token (messages never show
    it either). Everything else, and every other job's payload, as stored.

    Plain values are stored as given (``secret("name")`` stores only the name); this
    keeps them off the pages every operator can open.
    """
    if name != HTTP_JOB or not isinstance(payload, dict):
        return payload
    shown = dict(payload)
    url = shown.get("url")
    if isinstance(url, str) and "?" in url:
        shown["url"] = url.split("?", 1)[0] + "?" + HIDDEN
    headers = shown.get("headers")
    if isinstance(headers, dict):
        shown["headers"] = {
            key: HIDDEN if str(key).lower() in CREDENTIAL_HEADERS else value
            for key, value in headers.items()
        }
    return shown


# -- scheduling --------------------------------------------------------------------


def schedule_http(
    state: DeferState,
    url: str,
    *,
    method: str = "POST",
    json_body: Any = None,
    headers: Mapping[str, str | Secret] | None = None,
    sign: str | None = None,
    idempotency_key: str | None = None,
    timeout: Duration | None = None,
    **options: Unpack[ScheduleOptions],
) -> Job:
    """Schedule an HTTP request to *url*; joins ``db.session`` like ``defer.schedule``.

    *options* are ``schedule``'s (``run_at``, ``key``, the queue controls ...).
    *headers* values are strings or :func:`~.http_signing.secret` names; *sign* names
    a ``DEFER_WEBHOOK_SECRETS`` entry to sign with; *idempotency_key* replaces the
    drawn one (every attempt sends it as ``Idempotency-Key`` and ``webhook-id``).
    Everything that could not be sent as given is refused here, naming the argument
    (:class:`InvalidArgument`), rather than failing on every attempt later.
    """
    config = state.config
    target = check_url(url, config)
    payload: dict[str, Any] = {
        "url": target.url,
        "method": checked_method(method),
        "id": checked_id(idempotency_key) if idempotency_key is not None else str(uuid.uuid4()),
    }
    if headers is not None:
        if not isinstance(headers, Mapping):
            raise InvalidArgument("headers", f"expected a mapping of strings, got {headers!r}")
        plain = {name: value for name, value in headers.items() if not isinstance(value, Secret)}
        named = {name: value.name for name, value in headers.items() if isinstance(value, Secret)}
        check_headers(plain, named, config)
        if plain:
            payload["headers"] = plain
        if named:
            payload["secret_headers"] = named  # header -> secret name, never the value
    if sign is not None:
        payload["sign"] = checked_sign(sign, config)
    if json_body is not None:
        # Checked here so a problem names json=, not the job's payload around it.
        payload_text(json_body, "json", max_bytes=config.max_payload_bytes)
        payload["json"] = json_body
    if timeout is not None:
        payload["timeout"] = checked_timeout(timeout, config)
    return scheduling.schedule(state, HTTP_JOB, payload, **options)


# -- running -----------------------------------------------------------------------


def perform(job: Job, config: DeferConfig) -> dict[str, Any]:
    """Make the request of an HTTP job and turn the answer into its outcome."""
    asked = job.payload.get("method", "POST") if isinstance(job.payload, Mapping) else None
    method = asked if isinstance(asked, str) and asked.upper() in METHODS else "HTTP"
    try:
        request = checked_request(job, config)
        secret_headers = http_signing.header_values(request.secret_headers, config.http_secrets)
        keys = (
            http_signing.signing_keys(request.sign, config.webhook_secrets)
            if request.sign is not None
            else ()
        )
    except (InvalidArgument, SecretMissing) as refused:
        raise Fail(f"refused the {method} call: {refused}") from None
    target, method = request.target, request.method
    where = f"{method} {target.shown}"
    try:
        # Resolved once: the connection goes to these checked addresses, never to a
        # second answer of the DNS.
        addresses = http_guard.resolve(target.host, target.port, config.http_allowed_networks)
    except http_guard.AddressRefused as refused:
        raise Fail(f"refused {where}: {refused}") from None
    except OSError as error:
        raise HttpCallFailed(f"network error: {where}: cannot resolve the host: {error}") from error
    body = request.body
    defaults = {"User-Agent": _USER_AGENT, "Idempotency-Key": request.message_id}
    if body is not None:
        defaults["Content-Type"] = "application/json"
    # Header names are case-insensitive: a call's own "content-type" replaces the
    # default instead of going out beside it as a second Content-Type.
    given = {name.lower() for name in (*request.headers, *secret_headers)}
    headers = {name: value for name, value in defaults.items() if name.lower() not in given}
    headers.update(request.headers)
    headers.update(secret_headers)
    if keys:
        headers.update(
            http_signing.webhook_headers(request.message_id, int(time.time()), body or b"", keys)
        )
    # Whatever the receiver answers is kept (result, last_error, history, logs): never
    # with what we sent it in confidence.
    redact = Redactor(
        http_signing.sent_secrets(headers, secret_headers, keys)
        + list(config.http_secrets.values())
    )
    started = time.monotonic()
    try:
        answer = http_transport.send(
            scheme=target.scheme, host=target.host, port=target.port, targets=addresses,
            method=method, path=target.path, headers=headers, body=body,
            timeout=request.timeout, redact=redact,
        )  # fmt: skip
    except OSError as error:
        raise HttpCallFailed(f"network error: {where}: {error}") from error
    except (http.client.InvalidURL, UnicodeError, ValueError) as error:
        # The request cannot be written as it is: no retry will change that.
        raise Fail(f"refused {where}: cannot be sent: {error}") from None
    except http.client.HTTPException as error:
        raise HttpCallFailed(f"network error: {where}: {error}") from error
    return _outcome(answer, where, round((time.monotonic() - started) * 1000), config)


def _outcome(
    answer: http_transport.Answer, where: str, elapsed_ms: int, config: DeferConfig
) -> dict[str, Any]:
    """The job's result for a 2xx; otherwise the exception that retries or fails it."""
    if 200 <= answer.status < 300:
        return {
            "status": answer.status,
            "reason": answer.reason,
            "excerpt": answer.excerpt,
            "elapsed_ms": elapsed_ms,
        }
    # Status first, one line, bounded: an error's summary is the last line of its
    # traceback, and the worker's log line carries it whole.
    summary = f"HTTP {answer.status} {answer.reason}".rstrip() + f" from {where}"
    if answer.excerpt:
        summary += f": {answer.excerpt}"
    if answer.status in _RETRYABLE or answer.status >= 500:
        wait = _retry_after(answer.retry_after, cap=config.retry_cap)
        if wait is not None:
            raise RetryAfter(wait, summary)
        raise HttpCallFailed(summary)
    raise Fail(summary)


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
