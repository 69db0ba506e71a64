"""The settings this module adds refuse bad values at init_app, naming the key."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from flask_defer import InvalidArgument
from flask_defer.config import DEFAULTS, apply_defaults, load_config

from ..conftest import AppKit


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("DEFER_MAX_PAYLOAD_BYTES", 0),
        ("DEFER_MAX_PAYLOAD_BYTES", 2**40),
        ("DEFER_MAX_PAYLOAD_BYTES", "1MB"),
        ("DEFER_STRICT_LOCAL_TIMES", "yes"),
        ("DEFER_MAX_ATTEMPTS", 2**40),
        ("DEFER_LEASE", float("nan")),
        ("DEFER_RETENTION", float("inf")),
        ("DEFER_RETENTION", timedelta.max),
        ("DEFER_FRAME_ANCESTORS", "'self'; script-src *"),
    ],
)
def test_bad_settings_name_the_key(
    make_app: Callable[..., AppKit], key: str, value: Any
) -> None:
    with pytest.raises(InvalidArgument, match=key):
        make_app(**{key: value})


def test_new_settings_have_their_documented_defaults() -> None:
    config: dict[str, Any] = {}
    apply_defaults(config)
    loaded = load_config(config)
    assert DEFAULTS["DEFER_MAX_PAYLOAD_BYTES"] == loaded.max_payload_bytes == 1_000_000
    assert loaded.strict_local_times is False
    assert loaded.frame_ancestors == "'self'"
