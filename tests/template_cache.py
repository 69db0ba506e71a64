"""One compiled copy of each template per test process, shared by every app.

Almost every web, browser and API test builds a Flask app of its own, and each app
has a Jinja environment of its own that compiles every template it renders from
source. Profiled, that compile was most of a dashboard test's call (3.1 of 3.7 s for
eight list pages) and a good part of the whole suite's time. Jinja's bytecode cache is
the documented hook for reusing the compiled code; this one keeps it in memory, so
nothing outlives the process and nothing is written beside the templates.

A template is still compiled from its source at least once in every process, and its
code is still run for every render: only the repeated compile is saved. The cache key
holds the template's source checksum (Jinja's own) and the environment's extensions and
syntax options, so two apps that parse a template differently never share its code.
"""

from __future__ import annotations

from typing import Any

from flask import Flask
from jinja2 import Environment
from jinja2.bccache import Bucket, BytecodeCache

__all__ = ["SharedTemplateCache", "share_compiled_templates"]


def _parse_options(environment: Environment) -> tuple[Any, ...]:
    """What changes the code a template compiles to, beside its source."""
    return (
        tuple(sorted(environment.extensions)),
        environment.block_start_string,
        environment.variable_start_string,
        environment.comment_start_string,
        environment.line_statement_prefix,
        environment.line_comment_prefix,
        environment.trim_blocks,
        environment.lstrip_blocks,
        environment.newline_sequence,
        environment.keep_trailing_newline,
        environment.optimized,
        environment.finalize is not None,
        environment.is_async,
    )


class SharedTemplateCache(BytecodeCache):
    """Jinja bytecode kept in a dict, keyed by template, source and parse options."""

    def __init__(self) -> None:
        self._code: dict[tuple[Any, ...], bytes] = {}

    def _key(self, bucket: Bucket) -> tuple[Any, ...]:
        return (bucket.key, bucket.checksum, _parse_options(bucket.environment))

    def load_bytecode(self, bucket: Bucket) -> None:
        code = self._code.get(self._key(bucket))
        if code is not None:
            bucket.bytecode_from_string(code)

    def dump_bytecode(self, bucket: Bucket) -> None:
        self._code[self._key(bucket)] = bucket.bytecode_to_string()


def share_compiled_templates() -> None:
    """Give every Flask app made from now on in this process the shared cache."""
    Flask.jinja_options = {**Flask.jinja_options, "bytecode_cache": SharedTemplateCache()}
