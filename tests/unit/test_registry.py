"""``@defer.job`` refuses nonsense at the decorator line, before any job is scheduled."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from flask_defer import Defer, InvalidArgument, Job


def noop(job: Job) -> None:
    pass


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"timeout": float("nan")}, "timeout"),
        ({"timeout": float("inf")}, "timeout"),
        ({"timeout": 1e300}, "timeout"),
        ({"timeout": 0}, "timeout"),
        ({"atomic": "no"}, "atomic"),
        ({"atomic": 1}, "atomic"),
        ({"max_attempts": 2**40}, "max_attempts"),
        ({"max_attempts": 2**31}, "max_attempts"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"queue": "q\x00"}, "queue"),
    ],
)
def test_bad_handler_options_are_refused_at_the_decorator(
    options: dict[str, Any], argument: str
) -> None:
    defer = Defer()
    with pytest.raises(InvalidArgument) as caught:
        defer.job("send_email", **options)
    assert caught.value.argument == argument
    assert "send_email" not in defer.registry


def test_a_non_callable_handler_is_refused() -> None:
    defer = Defer()
    with pytest.raises(InvalidArgument) as caught:
        defer.job("send_email")("not a function")  # type: ignore[type-var]
    assert caught.value.argument == "handler"
    assert "send_email" not in defer.registry


def test_a_name_the_database_cannot_store_is_refused() -> None:
    with pytest.raises(InvalidArgument) as caught:
        Defer().job("send\x00email")
    assert caught.value.argument == "name"


def test_the_largest_storable_options_are_accepted() -> None:
    defer = Defer()
    defer.job("send_email", max_attempts=2**31 - 1, timeout=86_400.0, atomic=False)(noop)
    spec = defer.registry.get("send_email")
    assert spec is not None and spec.max_attempts == 2**31 - 1 and spec.timeout == 86_400.0


def test_a_handler_spec_knows_whether_its_handler_is_a_coroutine_function() -> None:
    """Looked up once at registration (the worker asks twice a job); a spec rebuilt
    with another handler (``dataclasses.replace``) looks again."""
    async def later(job: Job) -> None:
        pass

    defer = Defer()
    defer.job("plain")(noop)
    defer.job("coroutine")(later)
    plain, coroutine = defer.registry.get("plain"), defer.registry.get("coroutine")
    assert plain is not None and coroutine is not None
    assert (plain.is_async, coroutine.is_async) == (False, True)
    assert dataclasses.replace(plain, func=later).is_async is True
    assert dataclasses.replace(coroutine, func=noop).is_async is False
