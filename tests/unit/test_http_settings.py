"""The scheduled-HTTP settings are checked at init_app and never echo a secret."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from flask_defer import InvalidArgument
from flask_defer.config import apply_defaults, load_config

KEY = "whsec_" + base64.b64encode(b"k" * 32).decode()


def loaded(**settings: Any) -> Any:
    config: dict[str, Any] = dict(settings)
    apply_defaults(config)
    return load_config(config)


def test_defaults_allow_no_private_network_and_hold_no_secrets() -> None:
    config = loaded()
    assert config.http_allowed_networks == ()
    assert dict(config.http_secrets) == {} and dict(config.webhook_secrets) == {}


def test_webhook_secrets_are_decoded_in_order_and_kept_out_of_the_repr() -> None:
    unpadded = "whsec_" + base64.b64encode(b"n" * 32).decode().rstrip("=")
    config = loaded(
        DEFER_WEBHOOK_SECRETS={"billing": KEY, "crm": [KEY, unpadded]},
        DEFER_HTTP_SECRETS={"token": "Bearer abc"},
    )
    assert config.webhook_secrets["billing"] == (b"k" * 32,)
    assert config.webhook_secrets["crm"] == (b"k" * 32, b"n" * 32)
    assert config.http_secrets["token"] == "Bearer abc"
    shown = repr(config)
    assert "Bearer abc" not in shown and "kkkk" not in shown and KEY not in shown


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("DEFER_HTTP_ALLOWED_NETWORKS", "10.0.0.0/8"),
        ("DEFER_HTTP_ALLOWED_NETWORKS", ["10.0.0.1/8"]),  # host bits set: a typo
        ("DEFER_HTTP_ALLOWED_NETWORKS", ["intranet"]),
        ("DEFER_HTTP_ALLOWED_NETWORKS", 10),
        ("DEFER_HTTP_SECRETS", ["Bearer abc"]),
        ("DEFER_HTTP_SECRETS", {"token": "Bearer abc\r\nX-Evil: 1"}),
        ("DEFER_HTTP_SECRETS", {"token": ""}),
        ("DEFER_HTTP_SECRETS", {"two words": "x"}),
        ("DEFER_WEBHOOK_SECRETS", {"billing": base64.b64encode(b"k" * 32).decode()}),
        ("DEFER_WEBHOOK_SECRETS", {"billing": "whsec_not*base64"}),
        ("DEFER_WEBHOOK_SECRETS", {"billing": "whsec_" + base64.b64encode(b"short").decode()}),
        ("DEFER_WEBHOOK_SECRETS", {"billing": []}),
        ("DEFER_WEBHOOK_SECRETS", {"billing": [KEY, 7]}),
        ("DEFER_WEBHOOK_SECRETS", KEY),
    ],
)
def test_bad_http_settings_name_the_key_and_not_the_secret(key: str, value: Any) -> None:
    with pytest.raises(InvalidArgument) as raised:
        loaded(**{key: value})
    assert raised.value.argument.startswith(key)
    for secret_text in ("Bearer abc", "X-Evil", "not*base64"):
        assert secret_text not in str(raised.value)


def test_allowed_networks_are_parsed() -> None:
    config = loaded(DEFER_HTTP_ALLOWED_NETWORKS=["10.20.0.0/16", "::1"])
    assert [str(n) for n in config.http_allowed_networks] == ["10.20.0.0/16", "::1/128"]
