"""Where the no-JavaScript Undo may send the browser back to: this site only.

The ``next`` field comes from the form, so it is attacker-controlled. Only a path on
this host is accepted; anything with a scheme, a host, a protocol-relative ``//``,
backslashes (which browsers read as slashes) or control characters is refused, so
the Undo endpoint can never be used as an open redirect.
"""

from __future__ import annotations

from urllib.parse import urlsplit

MAX_LENGTH = 2048


def safe_local_target(target: str | None) -> str | None:
    """*target* if it is a path on this site, else None."""
    if not target or len(target) > MAX_LENGTH:
        return None
    if any(ord(char) < 32 or ord(char) == 127 or char == "\\" for char in target):
        return None
    if not target.startswith("/") or target.startswith("//"):
        return None
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return None
    return target


def path_of(url: str | None, host_url: str) -> str | None:
    """The local path and query of *url* if it is on *host_url* ("http://host/")."""
    if not url:
        return None
    if url.startswith(host_url):
        return safe_local_target("/" + url[len(host_url) :])
    return safe_local_target(url)
