"""``{defer-config}``: the table of every ``DEFER_*`` setting, rendered from the code.

The keys and defaults come from :data:`flask_defer.config.DEFAULTS`; each setting's
meaning from the comment written above it there, so the page cannot drift from the
code (a setting added without a comment fails the build).
"""

from __future__ import annotations

import ast
import io
import tokenize
from datetime import timedelta
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.application import Sphinx

from flask_defer import config


def comments_by_key() -> dict[str, str]:
    """The comment lines above each key of ``DEFAULTS``, joined, by key."""
    source = Path(config.__file__).read_text(encoding="utf-8")
    tree = ast.parse(source)
    start = end = 0
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "DEFAULTS":
            start, end = node.lineno, node.end_lineno or node.lineno
    found: dict[str, str] = {}
    pending: list[str] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        line = token.start[0]
        if not start < line <= end:
            continue
        if token.type == tokenize.COMMENT:
            pending.append(token.string.lstrip("#").strip())
        elif token.type == tokenize.STRING and token.string.strip("\"'").startswith("DEFER_"):
            key = token.string.strip("\"'")
            if pending:
                found[key] = " ".join(pending)
            elif found:
                # Keys written one after another share the comment above the first.
                found[key] = list(found.values())[-1]
            pending = []
    return found


def shown(value: Any) -> str:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
        for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
            if seconds >= size and seconds % size == 0:
                return f"{seconds / size:g} {unit}"
        return f"{seconds:g} s"
    return repr(value)


class DeferConfigTable(Directive):
    """A table of every setting: key, default, meaning."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        meanings = comments_by_key()
        missing = sorted(set(config.DEFAULTS) - set(meanings))
        if missing:
            raise self.error(f"settings without a comment in flask_defer.config: {missing}")
        table = nodes.table()
        group = nodes.tgroup(cols=3)
        table += group
        for width in (30, 15, 55):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        group += head
        head += self._row(["key", "default", "meaning"])
        body = nodes.tbody()
        group += body
        for key, value in config.DEFAULTS.items():
            body += self._row([key, shown(value), meanings[key]], literal=2)
        return [table]

    @staticmethod
    def _row(cells: list[str], literal: int = 0) -> nodes.row:
        row = nodes.row()
        for i, text in enumerate(cells):
            entry = nodes.entry()
            paragraph = nodes.paragraph()
            if i < literal:
                paragraph += nodes.literal(text=text)
            else:
                # ``code`` in a comment is code on the page too.
                for n, part in enumerate(text.split("``")):
                    paragraph += nodes.literal(text=part) if n % 2 else nodes.Text(part)
            entry += paragraph
            row += entry
        return row


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("defer-config", DeferConfigTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
