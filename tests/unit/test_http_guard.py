"""The address policy of scheduled HTTP calls: what counts as public, what is refused."""

from __future__ import annotations

from ipaddress import ip_address, ip_network

import pytest

from flask_defer.features.http_guard import literal_refusal, refusal


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("0.0.0.0", "an unspecified address"),
        ("::", "an unspecified address"),
        ("127.0.0.1", "a loopback address"),
        ("127.8.9.10", "a loopback address"),
        ("::1", "a loopback address"),
        ("10.0.0.1", "a private address"),
        ("172.16.5.4", "a private address"),
        ("192.168.1.1", "a private address"),
        ("fd00::1", "a private address"),  # IPv6 unique local
        ("169.254.169.254", "a link-local address"),  # cloud instance metadata
        ("fe80::1", "a link-local address"),
        ("224.0.0.1", "a multicast address"),
        ("233.252.0.1", "a multicast address"),  # globally scoped multicast too
        ("ff02::1", "a multicast address"),
        ("240.0.0.1", "a reserved address"),
        ("255.255.255.255", "a reserved address"),
        ("100.64.0.1", "a non-public address"),  # carrier-grade NAT
        ("192.0.2.10", "a private address"),  # documentation range
        ("::ffff:127.0.0.1", "a loopback address (IPv4 inside IPv6)"),
        ("::ffff:10.0.0.1", "a private address (IPv4 inside IPv6)"),
        ("::ffff:169.254.169.254", "a link-local address (IPv4 inside IPv6)"),
        ("64:ff9b::a9fe:a9fe", "a link-local address (IPv4 inside IPv6)"),  # NAT64
        ("2002:7f00:1::1", "a loopback address (IPv4 inside IPv6)"),  # 6to4
    ],
)
def test_non_public_addresses_are_refused_with_their_kind(address: str, reason: str) -> None:
    assert refusal(ip_address(address)) == reason


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert refusal(ip_address(address)) is None


def test_allowed_networks_admit_their_addresses_only() -> None:
    allowed = [ip_network("10.20.0.0/16"), ip_network("127.0.0.1/32")]
    assert refusal(ip_address("10.20.3.4"), allowed) is None
    assert refusal(ip_address("127.0.0.1"), allowed) is None
    assert refusal(ip_address("::ffff:10.20.3.4"), allowed) is None
    assert refusal(ip_address("10.21.0.1"), allowed) == "a private address"
    assert refusal(ip_address("127.0.0.2"), allowed) == "a loopback address"


def test_only_ip_literals_are_judged_when_scheduling() -> None:
    assert literal_refusal("api.example.com", ()) is None  # a name is resolved at run time
    assert literal_refusal("localhost", ()) is None
    why = literal_refusal("169.254.169.254", ())
    assert why is not None and why.startswith("169.254.169.254 is a link-local address")
    assert "DEFER_HTTP_ALLOWED_NETWORKS" in why
