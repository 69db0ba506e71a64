"""What a scheduled HTTP call carries that must not be stored: secrets and signatures.

A job row is read by the dashboard, copied into backups and kept for weeks, so a
secret in it would be a secret shared with all of those. Instead a call names its
secrets and they are looked up in the worker's config when the call runs:

* ``headers={"Authorization": secret("billing_token")}`` stores the name
  ``billing_token``; its value comes from ``DEFER_HTTP_SECRETS``;
* ``sign="billing"`` stores the name ``billing``; the call is signed per Standard
  Webhooks with every key of ``DEFER_WEBHOOK_SECRETS["billing"]``.

A name missing from the config fails the call with a message saying which, rather
than sending it unauthenticated or unsigned. And what the receiver answers is kept
(``last_error``, history, logs, the dashboard) only after every secret value sent,
the signature header and the signing keys are cut out of it (:class:`Redactor`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..config.http import check_secret_name


class SecretMissing(Exception):  # noqa: N818 - reads as what happened
    """A scheduled call names a secret the worker's config does not have."""


@dataclass(frozen=True, slots=True)
class Secret:
    """A header value given by name, resolved from ``DEFER_HTTP_SECRETS`` at run time."""

    name: str


def secret(name: str) -> Secret:
    """A header value that is looked up by *name* in ``DEFER_HTTP_SECRETS`` when the
    call runs: ``headers={"Authorization": secret("billing_token")}``."""
    return Secret(check_secret_name(name, "name"))


def header_values(names: Mapping[str, str], secrets: Mapping[str, str]) -> dict[str, str]:
    """The headers whose values are secrets, from the header → secret-name *names*."""
    headers: dict[str, str] = {}
    for header, name in names.items():
        value = secrets.get(name)
        if value is None:
            raise SecretMissing(
                f"header {header!r} names the secret {name!r}, which is not in DEFER_HTTP_SECRETS"
            )
        headers[header] = value
    return headers


def signing_keys(name: str, secrets: Mapping[str, tuple[bytes, ...]]) -> tuple[bytes, ...]:
    """The keys to sign with for the secret *name* (several while rotating)."""
    keys = secrets.get(name)
    if not keys:
        raise SecretMissing(
            f"the call is signed with {name!r}, which is not in DEFER_WEBHOOK_SECRETS"
        )
    return keys


def webhook_headers(
    message_id: str, timestamp: int, body: bytes, keys: Sequence[bytes]
) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt: its id, time and signatures.

    The signed content is ``{id}.{timestamp}.{body}``; each key gives one ``v1,<base64
    HMAC-SHA256>``, space-separated, so a receiver holding either the current or the
    next key verifies the call while the keys rotate. The id is the job's, the same on
    every attempt (receivers deduplicate on it); the timestamp is the attempt's own, as
    receivers refuse old ones.
    """
    content = b"%s.%d.%s" % (message_id.encode(), timestamp, body)
    signatures = " ".join(
        "v1," + base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
        for key in keys
    )
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signatures,
    }


#: Text that replaces a secret found in what a receiver answered.
REDACTED = "[redacted]"
#: Shorter pieces of a secret are not searched for on their own: replacing every "abc"
#: of an answer would garble it and hide nothing worth hiding.
_MIN_PIECE_CHARS = 4


class Redactor:
    """Removes the values of secrets from text a receiver answered before it is kept.

    A receiver that echoes the request (a debugging endpoint, an error page listing the
    headers) would otherwise put ``Authorization`` into ``last_error``, the history and
    the dashboard. Each secret is searched for as sent, as JSON and HTML would escape
    it, with its whitespace runs collapsed (as an excerpt collapses them), and piece by
    piece (the token of ``Bearer <token>``); the longest first, so a piece never leaves
    the rest of its secret behind.
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        needles: set[str] = set()
        for value in secrets:
            for form in (value, " ".join(value.split())):
                escaped = json.dumps(form)[1:-1]
                needles.update((form, escaped, escaped.replace("/", "\\/"), html.escape(form)))
            needles.update(value.split())
        self._needles = sorted((n for n in needles if len(n) >= _MIN_PIECE_CHARS), key=len)[::-1]

    def __call__(self, text: str) -> str:
        """*text* with every secret replaced by :data:`REDACTED`."""
        for needle in self._needles:
            if needle in text:
                text = text.replace(needle, REDACTED)
        return text

    def cut_partial(self, text: str) -> str:
        """*text* without a trailing start of a secret (a body cut short mid-secret)."""
        for needle in self._needles:
            for size in range(min(len(needle) - 1, len(text)), _MIN_PIECE_CHARS - 1, -1):
                if text.endswith(needle[:size]):
                    return text[:-size] + REDACTED
        return text


def sent_secrets(
    headers: Mapping[str, str], secret_headers: Iterable[str], keys: Sequence[bytes]
) -> list[str]:
    """What of one request must never be kept: secret header values, the signature
    header, and the signing keys in the forms they could be written in."""
    values = [headers[name] for name in secret_headers if name in headers]
    if "webhook-signature" in headers:
        values.append(headers["webhook-signature"])
        values.extend(headers["webhook-signature"].split())
    for key in keys:
        encoded = base64.b64encode(key).decode()
        values.extend((encoded, "whsec_" + encoded))
    return values
