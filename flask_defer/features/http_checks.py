"""What a scheduled HTTP call may send: every check, when it is scheduled and again when it runs.

A call is refused unless it could be sent exactly as given to a host it may reach:

* the URL (:func:`check_url`): http(s), a host, no credentials, no whitespace or
  control characters, an allowed host (``DEFER_HTTP_ALLOWED_HOSTS``) and, for an IP
  literal, an allowed address; non-ASCII hosts and paths are written as browsers
  write them (IDNA, percent-encoding);
* the method, the headers (:func:`check_headers`: RFC 9110 tokens for names, visible
  ASCII for values, none the call sets itself), the idempotency key, the signing
  secret's name and the timeout.

:func:`schedule_http` runs them on its arguments, naming the argument it refuses;
:func:`checked_request` runs them all again on the stored payload before anything is
sent, since a row may come from older code, from ``defer.schedule("flask_defer.http",
...)`` written around ``schedule_http``, or from an edit in the database.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from ..config import DeferConfig
from ..config.http import check_secret_name, header_name_problem, header_value_problem
from ..errors import InvalidArgument
from ..jobs import Job
from ..timeutil import Duration, as_duration
from ..validation import payload_text
from . import http_guard

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
PAYLOAD_KEYS = frozenset(
    {"url", "method", "id", "headers", "secret_headers", "sign", "json", "timeout"}
)
#: Longest caller-given idempotency key (a header value, signed into the webhook id).
_MAX_ID_CHARS = 255
#: Longest URL shown in a message (the query string is never shown: it may hold tokens).
_SHOWN_URL_CHARS = 200


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


@dataclass(frozen=True, slots=True)
class Request:
    """What a stored HTTP job asks to send, every part checked again."""

    target: CheckedUrl
    method: str
    message_id: str
    headers: dict[str, str]
    secret_headers: dict[str, str]
    sign: str | None
    body: bytes | None
    timeout: float


def checked_request(job: Job, config: DeferConfig) -> Request:
    """Every check :func:`schedule_http` makes, applied to the stored payload.

    The row may have been scheduled by older code, written as ``defer.schedule(
    "flask_defer.http", {...})`` around :func:`schedule_http`, or edited in the
    database; and the allow-lists and secrets may have changed since. So nothing of it
    is sent unless it would be accepted if scheduled now.
    """
    payload = job.payload
    if not isinstance(payload, Mapping):
        raise InvalidArgument("payload", "expected an object")
    unknown = sorted(set(payload) - PAYLOAD_KEYS)
    if unknown:
        raise InvalidArgument("payload", f"unknown fields {', '.join(map(repr, unknown))}")
    target = check_url(payload.get("url"), config)
    method = checked_method(payload.get("method", "POST"))
    plain = payload.get("headers") or {}
    named = payload.get("secret_headers") or {}
    check_headers(plain, named, config)
    sign = checked_sign(payload["sign"], config) if payload.get("sign") is not None else None
    timeout = config.http_timeout.total_seconds()
    if payload.get("timeout") is not None:
        seconds = payload["timeout"]
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise InvalidArgument("timeout", f"expected seconds, got {seconds!r}")
        timeout = checked_timeout(seconds, config)
    # Old rows (scheduled before calls drew an id) use their job id: stable too.
    message_id = checked_id(payload["id"]) if payload.get("id") else f"flask_defer-job-{job.id}"
    body = None
    if "json" in payload:
        body = payload_text(payload["json"], "json").encode()
    return Request(target, method, message_id, dict(plain), dict(named), sign, body, timeout)


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


def checked_sign(name: Any, config: DeferConfig) -> str:
    check_secret_name(name, "sign")
    if name not in config.webhook_secrets:
        raise InvalidArgument("sign", f"{name!r} is not in DEFER_WEBHOOK_SECRETS")
    return str(name)


def checked_timeout(timeout: Duration, config: DeferConfig) -> float:
    limit = as_duration(timeout, "timeout", allow_zero=False)
    if limit > config.http_timeout:
        raise InvalidArgument(
            "timeout", f"at most DEFER_HTTP_TIMEOUT ({config.http_timeout.total_seconds():g} s)"
        )
    return limit.total_seconds()


def checked_id(value: Any) -> str:
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


def checked_method(method: Any) -> str:
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise InvalidArgument(
            "method", f"expected one of {', '.join(sorted(METHODS))}, got {method!r}"
        )
    return method.upper()


def check_headers(plain: Any, named: Any, config: DeferConfig) -> None:
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
