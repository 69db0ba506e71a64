"""The test suite's shared URL builders (tests/url_rule_cache.py) build what Werkzeug would.

The suite's conftest installs the cache before any test runs, so every app here already
uses it; these tests pin that a shared builder still uses each app's own converters and
defaults, and that an equal rule really reuses the first one's builder (a rule whose converter
class differs gets its own).
"""

from __future__ import annotations

from typing import Any

from flask import Flask, url_for
from werkzeug.routing import BaseConverter, Rule


class _Upper(BaseConverter):
    def to_url(self, value: Any) -> str:
        return str(value).upper()


class _Lower(BaseConverter):
    def to_url(self, value: Any) -> str:
        return str(value).lower()


def _app(converter: type[BaseConverter], *, page_default: int | None) -> Flask:
    app = Flask(f"rules_{converter.__name__}_{page_default}")
    app.url_map.converters["case"] = converter

    @app.get("/name/<case:name>")
    def name(name: str) -> str:
        return name

    # A default for a part of the path is folded into the builder through the converter.
    @app.get("/folded/<case:name>", defaults={"name": "Ab"})
    def folded(name: str) -> str:
        return name

    defaults = {"n": page_default} if page_default is not None else None

    @app.get("/page/", defaults=defaults)
    @app.get("/page/<int:n>")
    def page(n: int) -> str:
        return str(n)

    return app


def test_equal_rules_of_two_apps_share_a_builder_and_keep_their_own_converters() -> None:
    assert getattr(Rule._compile_builder, "shared", False), "the cache is not installed"
    upper, lower = _app(_Upper, page_default=1), _app(_Lower, page_default=None)
    with upper.test_request_context():
        assert url_for("name", name="Mixed") == "/name/MIXED"
        assert url_for("folded", name="Ab") == "/folded/AB"
        assert url_for("page", n=1) == "/page/"  # the default folds the rule away
        assert url_for("page", n=3, q="x y") == "/page/3?q=x+y"
    with lower.test_request_context():
        assert url_for("name", name="Mixed") == "/name/mixed"
        assert url_for("folded", name="Ab") == "/folded/ab"
        assert url_for("page", n=1) == "/page/1"  # no default in this app
    rules = {app: {r.rule: r for r in app.url_map.iter_rules()} for app in (upper, lower)}
    shared = rules[upper]["/page/<int:n>"], rules[lower]["/page/<int:n>"]
    assert shared[0]._build.__func__ is shared[1]._build.__func__
    assert shared[0]._build_unknown.__func__ is shared[1]._build_unknown.__func__
    own = rules[upper]["/name/<case:name>"], rules[lower]["/name/<case:name>"]
    assert own[0]._build.__func__ is not own[1]._build.__func__
