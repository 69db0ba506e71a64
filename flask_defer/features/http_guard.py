"""Which addresses a scheduled HTTP call may connect to (server-side request forgery).

A scheduled URL often comes from a user ("notify my endpoint"), and the worker runs
inside the network: without a check, ``http://169.254.169.254/`` reads the cloud's
instance credentials and ``http://localhost:5432/`` probes the database. So before
any connection the host is resolved once, and every address it resolves to must be
public, or inside ``DEFER_HTTP_ALLOWED_NETWORKS``. The call then connects to those
checked addresses only (:mod:`.http_transport`), never resolving the name again: a
DNS answer that changes between the check and the connection (rebinding) cannot
slip a private address in.

Refused unless allowed: unspecified, loopback, private (RFC 1918, IPv6 unique local),
link-local, multicast, reserved, and any other address not globally routable (shared
address space, documentation ranges), including IPv4 addresses carried inside IPv6
(``::ffff:127.0.0.1``, NAT64, 6to4, Teredo).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address, IPv6Network, ip_address

from ..config.http import IPNetwork

IPAddress = IPv4Address | IPv6Address

#: The well-known NAT64 prefix: its addresses carry an IPv4 address in the last 32 bits.
_NAT64 = IPv6Network("64:ff9b::/96")

#: How the resolver is asked; a module attribute so a test can hand it a DNS answer.
getaddrinfo = socket.getaddrinfo


class AddressRefused(Exception):  # noqa: N818 - reads as what happened
    """A host resolved to an address a scheduled call may not connect to."""


@dataclass(frozen=True, slots=True)
class Target:
    """A checked address to connect to: *host* is what ``getaddrinfo`` returned for it."""

    host: str
    address: IPAddress


def refusal(address: IPAddress, allowed: Sequence[IPNetwork] = ()) -> str | None:
    """Why *address* may not be called ("a loopback address"), or None if it may."""
    if any(address in network for network in allowed):
        return None
    if isinstance(address, IPv6Address):
        inner = _embedded_ipv4(address)
        if inner is not None:
            why = refusal(inner, allowed)
            return None if why is None else f"{why} (IPv4 inside IPv6)"
    for kind, test in (
        ("an unspecified", address.is_unspecified),
        ("a loopback", address.is_loopback),
        ("a link-local", address.is_link_local),
        ("a multicast", address.is_multicast),
        ("a reserved", address.is_reserved),
        ("a private", address.is_private),
        ("a non-public", not address.is_global),
    ):
        if test:
            return f"{kind} address"
    return None


def _embedded_ipv4(address: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, NAT64, 6to4, Teredo), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]  # the client's address; the server's is public
    return None


def resolve(host: str, port: int, allowed: Sequence[IPNetwork]) -> list[Target]:
    """Every address *host* resolves to, checked; raises :class:`AddressRefused` if one
    is refused (a name answering both a public and a private address is not trusted).

    DNS errors propagate as :class:`OSError` (``socket.gaierror``): a name that does not
    resolve now may tomorrow, so the caller retries them.
    """
    answers = getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    targets: list[Target] = []
    for _family, _type, _proto, _name, sockaddr in answers:
        found = str(sockaddr[0])
        address = ip_address(found.split("%", 1)[0])  # an IPv6 zone is not part of it
        why = refusal(address, allowed)
        if why is not None:
            shown = f"{host} is" if host == found else f"{host} resolves to {found},"
            raise AddressRefused(
                f"{shown} {why}: refused before connecting "
                "(allow it with DEFER_HTTP_ALLOWED_NETWORKS)"
            )
        if all(target.host != found for target in targets):
            targets.append(Target(found, address))
    if not targets:
        raise socket.gaierror(f"{host} resolved to no address")
    return targets


def literal_refusal(host: str, allowed: Sequence[IPNetwork]) -> str | None:
    """Why an IP-literal *host* may not be called (None: allowed, or not a literal).

    Checked when a call is scheduled, so ``http://10.0.0.1/`` is refused at once;
    a host name is only resolved when the call runs.
    """
    try:
        address = ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    why = refusal(address, allowed)
    return None if why is None else f"{host} is {why} (allow it with DEFER_HTTP_ALLOWED_NETWORKS)"
