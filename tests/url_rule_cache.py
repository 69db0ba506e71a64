"""One compiled URL builder per distinct rule per test process, shared by every app.

Werkzeug compiles two Python functions for every URL rule an app registers (to build
its URLs), from an AST, when the rule is bound. flask_defer's blueprints add 31 rules,
so each Flask app a test builds compiled 62 functions: under cProfile, 41 of the 110 ms
that building the dashboard tests' app took (about 17 of 56 ms of CPU without the
profiler), paid again by nearly every web, browser and API test. Werkzeug has no hook
for it, so this wraps its rule compiler: a builder is made once for each distinct rule
(its text, parsed parts, converter classes, defaults and kind) and bound to every later
rule like it, as it would have been compiled anew.

The generated function reads the rule's converters through the rule it is bound to,
so sharing it between two equal rules of different apps shares no state. A rule whose
defaults cannot be a dict key is compiled as before. Tests only: an app in production
builds its rules once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from werkzeug.routing import Rule

__all__ = ["share_compiled_url_builders"]

_Builder = Callable[..., tuple[str, str]]


def share_compiled_url_builders() -> None:
    """Make every URL rule bound from now on in this process reuse an equal rule's builder."""
    compile_builder = getattr(Rule, "_compile_builder", None)
    if compile_builder is None or getattr(compile_builder, "shared", False):
        return  # a Werkzeug without it (the cache's test says so), or installed already
    builders: dict[tuple[Any, ...], _Builder] = {}

    def shared_builder(self: Rule, append_unknown: bool = True) -> _Builder:
        defaults = self.defaults or {}
        # The converters' classes too: a default for a part of the path is folded into
        # the code through the rule's converter, and two apps may give one name two.
        converters = tuple((name, type(value)) for name, value in self._converters.items())
        key = (self.rule, tuple(self._trace), converters, tuple(defaults.items()),
               append_unknown)  # fmt: skip
        try:
            builder = builders.get(key)
        except TypeError:  # an unhashable default
            return compile_builder(self, append_unknown)
        if builder is None:
            builder = builders[key] = compile_builder(self, append_unknown)
        return builder

    shared_builder.shared = True  # type: ignore[attr-defined]
    Rule._compile_builder = shared_builder  # type: ignore[method-assign]
