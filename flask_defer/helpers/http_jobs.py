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

Every attempt of a job sends the same ``Idempotency-Key`` (and, when signed, the same
``webhook-id``), drawn when the call is scheduled, so a receiver can tell a retry
from a new call. Secrets are named, not stored (:mod:`.http_signing`); the host is
resolved when the call runs and only public addresses, or those in
``DEFER_HTTP_ALLOWED_NETWORKS``, are connected to (:mod:`.http_guard`);
``DEFER_HTTP_ALLOWED_HOSTS`` restricts the host names, checked when the call is
scheduled and again when it runs; ``DEFER_HTTP_TIMEOUT`` is the default and the upper
bound of a call's timeout.
"""

from __future__ import annotations

import email.utils
import http.client
import time
import unicodedata
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlsplit

from ..config import DeferConfig
from ..errors import InvalidArgument
from ..http_settings import check_secret_name, header_name_problem, header_value_problem
from ..jobs import Fail, Job, RetryAfter
from ..registry import HandlerSpec, Registry
from ..state import DeferState, current_state
from ..timeutil import Duration, as_duration
from ..validation import payload_text
from . import http_guard, http_signing, http_transport
from .http_signing import Redactor, Secret, SecretMissing
from .http_transport import EXCERPT_CHARS

__all__ = ["EXCERPT_CHARS", "HTTP_JOB", "HttpCallFailed", "schedule_http"]

#: Name of the built-in job that performs a scheduled HTTP request.
HTTP_JOB = "flask_defer.http"

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

#: Headers the call sets itself; a caller's own would contradict them, the framing
#: of the request or the connection it is sent on.
_RESERVED_HEADERS = frozenset(
    {
        "idempotency-key", "webhook-id", "webhook-timestamp", "webhook-signature",
        "host", "content-length", "transfer-encoding", "connection", "keep-alive",
        "te", "trailer", "upgrade", "expect", "proxy-connection",
    }
)  # fmt: skip
#: Most headers a call may carry.
_MAX_HEADERS = 100
#: What a URL's path and query keep as they are; anything else is percent-encoded.
_ASCII_VISIBLE = "".join(chr(code) for code in range(0x21, 0x7F))
#: What an HTTP job's payload may hold; a row with anything else is refused at run time.
_PAYLOAD_KEYS = frozenset(
    {"url", "method", "id", "headers", "secret_headers", "sign", "json", "timeout"}
)
#: Longest caller-given idempotency key (a header value, signed into the webhook id).
_MAX_ID_CHARS = 255
#: Longest URL shown in a message (the query string is never shown: it may hold tokens).
_SHOWN_URL_CHARS = 200

_RETRYABLE = frozenset({408, 429})
_USER_AGENT = "flask_defer"


class HttpCallFailed(Exception):  # noqa: N818 - reads as what happened
    """A scheduled HTTP call failed in a way that is worth retrying."""


@dataclass(frozen=True, slots=True)
class CheckedUrl:
    """The parts of a checked URL the request is built from."""

    scheme: str
    host: str
    port: int
    path: str
    #: The URL as messages show it: no query, no fragment, bounded.
    shown: str
    #: The URL as it is stored and called: ASCII, without its fragment.
    url: str


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
    run_at: datetime | None = None,
    delay: Duration | None = None,
    key: str | None = None,
    timeout: Duration | None = None,
    replace: bool = False,
    owner: str | None = None,
    label: str | None = None,
) -> Job:
    """Schedule an HTTP request to *url*; joins ``db.session`` like ``defer.schedule``.

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
        "method": _checked_method(method),
        "id": _checked_id(idempotency_key) if idempotency_key is not None else str(uuid.uuid4()),
    }
    if headers is not None:
        if not isinstance(headers, Mapping):
            raise InvalidArgument("headers", f"expected a mapping of strings, got {headers!r}")
        plain = {name: value for name, value in headers.items() if not isinstance(value, Secret)}
        named = {name: value.name for name, value in headers.items() if isinstance(value, Secret)}
        _check_headers(plain, named, config)
        if plain:
            payload["headers"] = plain
        if named:
            payload["secret_headers"] = named  # header -> secret name, never the value
    if sign is not None:
        payload["sign"] = _checked_sign(sign, config)
    if json_body is not None:
        # Checked here so a problem names json=, not the job's payload around it.
        payload_text(json_body, "json", max_bytes=config.max_payload_bytes)
        payload["json"] = json_body
    if timeout is not None:
        payload["timeout"] = _checked_timeout(timeout, config)
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


def check_url(url: Any, config: DeferConfig) -> CheckedUrl:
    """Refuse URLs that are not http(s), carry credentials or characters that cannot
    be sent, or whose host is not allowed (by name, or an IP literal by address);
    return the request's parts.

    As browsers do, a host name in another script is sent in its IDNA form and the
    non-ASCII characters of the path and query percent-encoded (UTF-8), so
    ``https://bücher.example/café`` is called as ``https://xn--bcher-kva.example/caf%C3%A9``.
    """
    if not isinstance(url, str):
        raise InvalidArgument("url", f"expected a string, got {url!r}")
    bad = next((ch for ch in url if _unsendable(ch)), None)
    if bad is not None:
        raise InvalidArgument(
            "url", f"must not contain whitespace or control characters, found {bad!r}"
        )
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgument("url", f"expected an http(s):// URL with a host, got {url!r}")
    if parts.username is not None or parts.password is not None:
        # They would be stored in the job row, in the clear, for weeks.
        raise InvalidArgument(
            "url", "must not contain credentials; use headers={'Authorization': secret(...)}"
        )
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise InvalidArgument("url", f"invalid port in {url!r}") from None
    host = _ascii_host(parts.hostname.lower().rstrip("."))
    if not host_allowed(host, config.http_allowed_hosts):
        raise InvalidArgument("url", f"host {host!r} is not in DEFER_HTTP_ALLOWED_HOSTS")
    why = http_guard.literal_refusal(host, config.http_allowed_networks)
    if why is not None:
        raise InvalidArgument("url", why)
    netloc = parts.netloc if parts.netloc.isascii() else _netloc(host, parts.port)
    path = quote(parts.path or "/", safe=_ASCII_VISIBLE)
    query = quote(parts.query, safe=_ASCII_VISIBLE)
    sent = path + (f"?{query}" if query else "")
    shown = f"{parts.scheme}://{netloc}{path}"
    if len(shown) > _SHOWN_URL_CHARS:
        shown = shown[:_SHOWN_URL_CHARS] + "…"
    return CheckedUrl(parts.scheme, host, port, sent, shown, f"{parts.scheme}://{netloc}{sent}")


def _unsendable(ch: str) -> bool:
    """A character no URL may carry: whitespace, controls, format and separator marks."""
    return ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs")


def _ascii_host(host: str) -> str:
    if host.isascii():
        return host
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError as error:
        raise InvalidArgument(
            "url", f"the host {host!r} is not a valid domain name: {error}"
        ) from None


def _netloc(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


def host_allowed(host: str, allowed: frozenset[str] | None) -> bool:
    """True if *host* is allowed: any host when *allowed* is None, else listed or a
    subdomain of a ``*.domain`` entry."""
    if allowed is None or host in allowed:
        return True
    return any(
        entry.startswith("*.") and host.endswith(entry[1:]) for entry in allowed
    )


def _checked_sign(name: Any, config: DeferConfig) -> str:
    check_secret_name(name, "sign")
    if name not in config.webhook_secrets:
        raise InvalidArgument("sign", f"{name!r} is not in DEFER_WEBHOOK_SECRETS")
    return str(name)


def _checked_timeout(timeout: Duration, config: DeferConfig) -> float:
    limit = as_duration(timeout, "timeout", allow_zero=False)
    if limit > config.http_timeout:
        raise InvalidArgument(
            "timeout", f"at most DEFER_HTTP_TIMEOUT ({config.http_timeout.total_seconds():g} s)"
        )
    return limit.total_seconds()


def _checked_id(value: Any) -> str:
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= _MAX_ID_CHARS
        or not all("!" <= ch <= "~" for ch in value)
    ):
        raise InvalidArgument(
            "idempotency_key",
            f"expected 1 to {_MAX_ID_CHARS} visible ASCII characters, got {value!r}",
        )
    return value


def _checked_method(method: Any) -> str:
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise InvalidArgument(
            "method", f"expected one of {', '.join(sorted(METHODS))}, got {method!r}"
        )
    return method.upper()


def _check_headers(plain: Any, named: Any, config: DeferConfig) -> None:
    """Refuse headers that could not be sent as given, that the call sets itself, or
    that name a secret the config lacks; *named* maps header names to secret names.

    Names must be RFC 9110 tokens and values visible ASCII: anything else is read one
    way by one server and another way by the next (request smuggling), or cannot be
    encoded at all and would fail every attempt.
    """
    seen: set[str] = set()
    for headers in (plain, named):
        if not isinstance(headers, Mapping):
            raise InvalidArgument("headers", f"expected a mapping of strings, got {headers!r}")
        if len(seen) + len(headers) > _MAX_HEADERS:
            raise InvalidArgument("headers", f"at most {_MAX_HEADERS} headers")
        for name, value in headers.items():
            why = header_name_problem(name)
            if why is not None:
                raise InvalidArgument("headers", why)
            if name.lower() in _RESERVED_HEADERS:
                hint = " (pass idempotency_key=...)" if name.lower() == "idempotency-key" else ""
                raise InvalidArgument("headers", f"{name!r} is set by the call itself{hint}")
            if name.lower() in seen:
                raise InvalidArgument("headers", f"{name!r} is given twice (names ignore case)")
            seen.add(name.lower())
            if headers is named:
                check_secret_name(value, "headers")
                if value not in config.http_secrets:
                    raise InvalidArgument(
                        "headers",
                        f"{name!r}: the secret {value!r} is not in DEFER_HTTP_SECRETS",
                    )
                continue
            why = header_value_problem(value)
            if why is not None:
                if not isinstance(value, str):
                    why = f"values must be strings or secret(...), got {value!r}"
                raise InvalidArgument("headers", f"the value of {name!r}: {why}")


# -- running -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Request:
    """What a stored HTTP job asks to send, every part checked again."""

    target: CheckedUrl
    method: str
    message_id: str
    headers: dict[str, str]
    secret_headers: dict[str, str]
    sign: str | None
    body: bytes | None
    timeout: float


def _checked_request(job: Job, config: DeferConfig) -> _Request:
    """Every check :func:`schedule_http` makes, applied to the stored payload.

    The row may have been scheduled by older code, written as ``defer.schedule(
    "flask_defer.http", {...})`` around :func:`schedule_http`, or edited in the
    database; and the allow-lists and secrets may have changed since. So nothing of it
    is sent unless it would be accepted if scheduled now.
    """
    payload = job.payload
    if not isinstance(payload, Mapping):
        raise InvalidArgument("payload", "expected an object")
    unknown = sorted(set(payload) - _PAYLOAD_KEYS)
    if unknown:
        raise InvalidArgument("payload", f"unknown fields {', '.join(map(repr, unknown))}")
    target = check_url(payload.get("url"), config)
    method = _checked_method(payload.get("method", "POST"))
    plain = payload.get("headers") or {}
    named = payload.get("secret_headers") or {}
    _check_headers(plain, named, config)
    sign = _checked_sign(payload["sign"], config) if payload.get("sign") is not None else None
    timeout = config.http_timeout.total_seconds()
    if payload.get("timeout") is not None:
        seconds = payload["timeout"]
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise InvalidArgument("timeout", f"expected seconds, got {seconds!r}")
        timeout = _checked_timeout(seconds, config)
    # Old rows (scheduled before calls drew an id) use their job id: stable too.
    message_id = _checked_id(payload["id"]) if payload.get("id") else f"flask_defer-job-{job.id}"
    body = None
    if "json" in payload:
        body = payload_text(payload["json"], "json").encode()
    return _Request(target, method, message_id, dict(plain), dict(named), sign, body, timeout)


def perform(job: Job, config: DeferConfig) -> dict[str, Any]:
    """Make the request of an HTTP job and turn the answer into its outcome."""
    asked = job.payload.get("method", "POST") if isinstance(job.payload, Mapping) else None
    method = asked if isinstance(asked, str) and asked.upper() in METHODS else "HTTP"
    try:
        request = _checked_request(job, config)
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
    headers = {"User-Agent": _USER_AGENT, "Idempotency-Key": request.message_id}
    if body is not None:
        headers["Content-Type"] = "application/json"
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
