"""One HTTP request to checked addresses, and a short text excerpt of its answer.

The connection goes to an address :mod:`.http_guard` checked, never to the name
resolved again, while the request still says the name: the ``Host`` header and, for
HTTPS, the TLS server name and certificate check use the host of the URL. Redirects
are not followed (the standard library's ``http.client`` never does): a 3xx is the
answer. Proxy settings from the environment are not used, since a proxy would make the
address check meaningless.

Only the first :data:`READ_LIMIT` bytes of a body are read, within the call's
deadline, and only text is kept: HTML is reduced to its visible text, and a body that
is not text (an image, a zip) is described, not shown.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any, Protocol

from .http_guard import Target

#: Characters of the response body kept (the job's result, last_error, history, logs).
EXCERPT_CHARS = 500
#: Bytes read from a response at most; the rest is never downloaded. More than the
#: excerpt: an HTML page's visible text often starts after kilobytes of markup.
READ_LIMIT = 64 * 1024

class Redact(Protocol):
    """Cuts secrets out of text (:class:`~.http_signing.Redactor`)."""

    def __call__(self, text: str) -> str: ...

    def cut_partial(self, text: str) -> str: ...


_TEXT_SUBTYPES = frozenset({"json", "xml", "javascript", "x-www-form-urlencoded", "csv"})
_tls: ssl.SSLContext | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """What the server answered: status line, the headers we use, a text excerpt."""

    status: int
    reason: str
    retry_after: str | None
    content_type: str | None
    excerpt: str


def open_socket(address: str, port: int, timeout: float) -> socket.socket:
    """Connect to one checked *address* (a module function: the only way out)."""
    return socket.create_connection((address, port), timeout=timeout)


def _tls_context() -> ssl.SSLContext:
    """The default verifying TLS context, built once (loading the CA store is slow)."""
    global _tls
    if _tls is None:
        _tls = ssl.create_default_context()
    return _tls


class _PinnedConnection(http.client.HTTPConnection):
    """An HTTP connection for *host* that connects to the checked *targets* only."""

    def __init__(self, host: str, port: int, targets: Sequence[Target], timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._targets = targets
        self._timeout = timeout

    def connect(self) -> None:
        error: OSError | None = None
        for target in self._targets:  # in the resolver's order, as create_connection does
            try:
                self.sock = open_socket(target.host, self.port, self._timeout)
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return
            except OSError as failed:
                error = failed
        assert error is not None  # resolve() returns at least one target
        raise error


class _PinnedTLSConnection(_PinnedConnection):
    """The same over TLS: the certificate is checked against the URL's host name."""

    default_port = http.client.HTTPS_PORT

    def connect(self) -> None:
        super().connect()
        self.sock = _tls_context().wrap_socket(self.sock, server_hostname=self.host)


def send(
    *,
    scheme: str,
    host: str,
    port: int,
    targets: Sequence[Target],
    method: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes | None,
    timeout: float,
    redact: Redact | None = None,
) -> Answer:
    """Make one request and read its answer within *timeout* seconds in all.

    Connection and read errors raise :class:`OSError` or
    :class:`http.client.HTTPException`; any status is an :class:`Answer`, whose reason
    and excerpt have passed through *redact* (secrets the receiver echoed are cut out).
    """
    started = time.monotonic()
    kind = _PinnedTLSConnection if scheme == "https" else _PinnedConnection
    connection = kind(host, port, targets, timeout)
    try:
        connection.request(method, path, body=body, headers=dict(headers))
        response = connection.getresponse()
        raw, truncated = _read(response, deadline=started + timeout)
        content_type = response.getheader("Content-Type")
        reason = " ".join((response.reason or "").split())
        return Answer(
            status=response.status,
            reason=redact(reason) if redact else reason,
            retry_after=response.getheader("Retry-After"),
            content_type=content_type,
            excerpt=excerpt(raw, response.headers, truncated=truncated, redact=redact),
        )
    finally:
        connection.close()


def _read(response: http.client.HTTPResponse, *, deadline: float) -> tuple[bytes, bool]:
    """Up to READ_LIMIT bytes of the body, read by *deadline* (a trickle cannot hold on);
    and whether there was more."""
    chunks: list[bytes] = []
    size = 0
    while size < READ_LIMIT:
        if time.monotonic() > deadline:
            raise TimeoutError("the response body did not arrive within the timeout")
        # Small reads: each waits at most the socket timeout, then the deadline is checked.
        chunk = response.read1(min(16 * 1024, READ_LIMIT - size))
        if not chunk:
            return b"".join(chunks), False
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks), True


def excerpt(
    raw: bytes, headers: Any, *, truncated: bool = False, redact: Redact | None = None
) -> str:
    """At most EXCERPT_CHARS of the body as one line of text ("…" when cut short).

    *headers* is the response's :class:`email.message.Message`. HTML becomes its
    visible text; a body that is not text becomes "[N bytes of image/png]". *redact*
    runs on the text as decoded and again once whitespace is collapsed, and before the
    text is cut to length, so no part of a secret survives the cut.
    """
    content_type = headers.get_content_type() if headers.get("Content-Type") else None
    if not raw:
        return ""
    if not _is_text(content_type, raw):
        more = "+" if truncated else ""
        return f"[{len(raw)}{more} bytes of {content_type or 'binary data'}]"
    text = raw.decode(headers.get_content_charset() or "utf-8", errors="replace")
    if redact is not None:
        text = redact(text)
    if content_type in ("text/html", "application/xhtml+xml"):
        text = _visible_text(text)
    # Control characters would garble a log line or a terminal; whitespace runs and line
    # breaks become single spaces, so the excerpt is one line.
    text = "".join(" " if unicodedata.category(c) == "Cc" else c for c in text)
    text = " ".join(text.split())
    if redact is not None:
        text = redact(text)
        if truncated:  # the body was cut at READ_LIMIT, perhaps inside a secret
            text = redact.cut_partial(text)
    if len(text) > EXCERPT_CHARS or truncated:
        return text[:EXCERPT_CHARS] + "…"
    return text


def _is_text(content_type: str | None, raw: bytes) -> bool:
    if content_type is None:
        return b"\x00" not in raw[:1024]  # no type given: text unless it looks binary
    main, _, sub = content_type.partition("/")
    return main == "text" or sub in _TEXT_SUBTYPES or sub.endswith(("+json", "+xml"))


class _TextOfHtml(HTMLParser):
    """Collects an HTML page's text, leaving out scripts and styles."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag in ("script", "style"):
            self._hidden += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self._hidden:
            self._hidden -= 1

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self.parts.append(data)


def _visible_text(html: str) -> str:
    parser = _TextOfHtml()
    parser.feed(html)
    parser.close()
    return " ".join(parser.parts)
