"""The conditions of ``list``, ``count`` and the bulk operations, from a :class:`JobFilter`.

Pure SQL expressions over the jobs table (no connection): ``StoreBase._filter`` builds
them for the reads and the bulk cancel and retry, so every caller filters alike.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, Table, and_, func, literal

from .records import JobFilter


def job_filter(table: Table, where: JobFilter, *, sqlite: bool) -> ColumnElement[bool]:
    """Every condition *where* sets, ANDed (``TRUE`` when it sets none)."""
    t = table
    conditions: list[ColumnElement[bool]] = []
    if where.statuses:
        conditions.append(t.c.status.in_([s.value for s in where.statuses]))
    if where.name is not None:
        conditions.append(t.c.name == where.name)
    if where.owner is not None:
        conditions.append(t.c.owner == where.owner)
    if where.queue is not None:
        conditions.append(t.c.queue == where.queue)
    if where.key_prefix is not None:
        conditions.append(key_startswith(t, where.key_prefix, sqlite=sqlite))
    return and_(literal(True), *conditions)


def key_startswith(table: Table, prefix: str, *, sqlite: bool) -> ColumnElement[bool]:
    """``key`` starts with *prefix*, exactly (case and wildcards included)."""
    # autoescape escapes % and _ in the bound prefix, so "a_b:" matches only itself.
    like = table.c.key.startswith(prefix, autoescape=True)
    if sqlite:
        # SQLite's LIKE ignores ASCII case; the exact substr comparison restores it.
        return like & (func.substr(table.c.key, 1, len(prefix)) == prefix)
    return like
