"""The scheduled-HTTP settings, checked and normalised for the frozen config.

Three settings decide what a scheduled call may reach and what it may carry, and each
is refused at ``init_app`` with an error naming the key, not when the first job runs:

* ``DEFER_HTTP_ALLOWED_NETWORKS``: networks a call may connect to although they are not
  public (loopback, private, link-local ...); everything else non-public is refused;
* ``DEFER_HTTP_SECRETS``: header values by name, for ``secret("name")`` in headers,
  each a valid header value (visible ASCII, see :func:`header_value_problem`);
* ``DEFER_WEBHOOK_SECRETS``: Standard Webhooks signing keys by name, one or several
  (several while rotating: each call is signed with every one of them).

Secrets live only here, in the app's config; job rows carry their names.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from ipaddress import IPv4Network, IPv6Network, ip_network
from types import MappingProxyType
from typing import Any

from ..errors import InvalidArgument

IPNetwork = IPv4Network | IPv6Network

#: The prefix of a Standard Webhooks secret; the rest is its key in base64.
WEBHOOK_SECRET_PREFIX = "whsec_"
#: The shortest signing key accepted, in bytes (the Standard Webhooks specification
#: asks for 24 to 64 random bytes: a short key can be guessed from signed messages).
MIN_WEBHOOK_KEY_BYTES = 24

_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,100}")
#: A header name: an RFC 9110 token. Anything else (a tab, a space, a colon, a control
#: character) is read differently by different servers and proxies: ``Host\t`` is
#: ``Host`` to a lenient one, which is how a request is smuggled past a check.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,256}")
#: A header value: visible ASCII, with spaces and tabs inside but not at either end
#: (RFC 9110's field-value). No line break, NUL, VT, FF or non-ASCII character.
_HEADER_VALUE = re.compile(r"(?:[\x21-\x7e](?:[\t\x20-\x7e]*[\x21-\x7e])?)?")
#: The longest header value sent (servers refuse header sections of 8 to 16 KiB).
MAX_HEADER_VALUE_CHARS = 8192


def header_name_problem(name: Any) -> str | None:
    """Why *name* cannot be sent as an HTTP header name, or None if it can."""
    if not isinstance(name, str):
        return f"names must be strings, got {name!r}"
    if not _HEADER_NAME.fullmatch(name):
        return (
            f"invalid header name {name!r}: expected 1 to 256 letters, digits or "
            "!#$%&'*+-.^_`|~ (an RFC 9110 token)"
        )
    return None


def header_value_problem(value: Any) -> str | None:
    """Why *value* cannot be sent as an HTTP header value, or None if it can."""
    if not isinstance(value, str):
        return f"expected a string, got {type(value).__name__}"
    if len(value) > MAX_HEADER_VALUE_CHARS:
        return f"longer than {MAX_HEADER_VALUE_CHARS} characters"
    if not _HEADER_VALUE.fullmatch(value):
        return (
            "expected visible ASCII characters, with spaces or tabs only between them "
            "(no line break, control or non-ASCII character)"
        )
    return None


def check_secret_name(name: Any, argument: str) -> str:
    """Refuse a secret name that could not be a key of the secrets settings."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgument(
            argument, f"expected a secret name of letters, digits and '_.:-', got {name!r}"
        )
    return name


def allowed_networks(value: Any) -> tuple[IPNetwork, ...]:
    """``DEFER_HTTP_ALLOWED_NETWORKS`` as networks (``"10.0.0.0/8"``, ``"::1"``)."""
    name = "DEFER_HTTP_ALLOWED_NETWORKS"
    if value is None:
        return ()
    if isinstance(value, str) or not _iterable(value):
        # A bare string would otherwise be read character by character.
        raise InvalidArgument(name, f"expected a list of networks like '10.0.0.0/8', got {value!r}")
    networks: list[IPNetwork] = []
    for entry in value:
        try:
            networks.append(ip_network(entry, strict=True))
        except (TypeError, ValueError) as error:
            raise InvalidArgument(
                name, f"expected networks like '10.0.0.0/8' or '::1/128', got {entry!r}: {error}"
            ) from None
    return tuple(networks)


def header_secrets(value: Any) -> Mapping[str, str]:
    """``DEFER_HTTP_SECRETS``: header values by name, each a one-line string."""
    name = "DEFER_HTTP_SECRETS"
    checked: dict[str, str] = {}
    for key, secret in _named(value, name).items():
        # The value is sent as a header: a line break would start another header, and
        # what is not visible ASCII is read differently by each server on the way.
        why = "is empty" if secret == "" else header_value_problem(secret)
        if why is not None:
            # Never the value itself in the message: it is a secret.
            raise InvalidArgument(f"{name}[{key!r}]", f"not a valid header value: {why}")
        checked[key] = secret
    return MappingProxyType(checked)


def webhook_secrets(value: Any) -> Mapping[str, tuple[bytes, ...]]:
    """``DEFER_WEBHOOK_SECRETS``: signing keys by name, decoded, in the order given.

    A name maps to one ``whsec_...`` secret or to a list of them: while rotating, the
    current one and the next, and every call is signed with each.
    """
    name = "DEFER_WEBHOOK_SECRETS"
    checked: dict[str, tuple[bytes, ...]] = {}
    for key, secrets in _named(value, name).items():
        entries = [secrets] if isinstance(secrets, str) else secrets
        if not _iterable(entries) or not list(entries):
            raise InvalidArgument(
                f"{name}[{key!r}]", "expected a 'whsec_...' secret or a list of them"
            )
        checked[key] = tuple(_webhook_key(entry, f"{name}[{key!r}]") for entry in entries)
    return MappingProxyType(checked)


def _webhook_key(secret: Any, name: str) -> bytes:
    """The key of one ``whsec_<base64>`` secret; the secret itself is never in a message."""
    if not isinstance(secret, str) or not secret.startswith(WEBHOOK_SECRET_PREFIX):
        raise InvalidArgument(name, f"expected a secret starting with {WEBHOOK_SECRET_PREFIX!r}")
    encoded = secret.removeprefix(WEBHOOK_SECRET_PREFIX)
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument(name, "the part after 'whsec_' is not base64") from None
    if len(key) < MIN_WEBHOOK_KEY_BYTES:
        raise InvalidArgument(
            name, f"the key is {len(key)} bytes; at least {MIN_WEBHOOK_KEY_BYTES} are needed"
        )
    return key


def _named(value: Any, name: str) -> dict[str, Any]:
    """A secrets setting as a dict with checked names (None: no secrets)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgument(
            name, f"expected a dict of secrets by name, got {type(value).__name__}"
        )
    return {check_secret_name(key, name): secret for key, secret in value.items()}


def _iterable(value: Any) -> bool:
    try:
        iter(value)
    except TypeError:
        return False
    return not isinstance(value, Mapping | bytes)
