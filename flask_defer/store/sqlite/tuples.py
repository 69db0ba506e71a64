"""SQLite's INSERT of many rows as positional tuples, compiled once per column set.

On SQLite the insert itself is cheap, and SQLAlchemy's execute spent most of an
enqueue building and converting parameter dicts (a one-row history INSERT cost 0.2 ms,
profiled). This sends the same compiled statement with the same per-column
conversions as positional tuples; a test checks the stored bytes match.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Any

from sqlalchemy import Connection, Table, insert

#: Compiled INSERTs by (table, column names, column sent as is): SQL, order, processors.
Prepared = dict[tuple[str, tuple[str, ...], str | None], Any]


def insert_tuples(
    conn: Connection,
    table: Table,
    rows: list[dict[str, Any]],
    cache: Prepared,
    *,
    as_is: str | None = None,
) -> None:
    """Insert *rows* (dicts with the same keys) into *table* on *conn*.

    Each column goes through its type's bind processor, as SQLAlchemy's own insert
    would; in a batch each distinct value is converted once (a batch shares its
    timestamps). The column *as_is* is sent unconverted (its values are already in
    stored form). *cache* keeps the compiled statements between calls.
    """
    key = (table.name, tuple(rows[0]), as_is)
    prepared = cache.get(key)
    if prepared is None:
        compiled = insert(table).compile(dialect=conn.dialect, column_keys=list(rows[0]))
        order = tuple(compiled.positiontup or ())
        processors = tuple(
            None
            if name == as_is
            else table.c[name].type.dialect_impl(conn.dialect).bind_processor(conn.dialect)
            for name in order
        )
        prepared = cache[key] = (compiled.string, order, processors)
    sql, order, processors = prepared
    # One C call per row for the whole tuple (itemgetter of one name gives no tuple).
    values_of = itemgetter(*order) if len(order) > 1 else lambda row: (row[order[0]],)
    if len(rows) == 1:
        row = values_of(rows[0])
        one = tuple(
            value if process is None else process(value)
            for process, value in zip(processors, row, strict=True)
        )
        conn.exec_driver_sql(sql, one)
        return
    # Only the columns that have a conversion are touched per row.
    converted = [(i, _once_per_value(p)) for i, p in enumerate(processors) if p is not None]
    params: list[Any] = []
    for row in rows:
        values = values_of(row)
        if converted:
            changed = list(values)
            for i, convert in converted:
                changed[i] = convert(changed[i])
            values = tuple(changed)
        params.append(values)
    conn.exec_driver_sql(sql, params)


def _once_per_value(process: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """*process*, remembering its answer for each distinct (hashable) value it is given."""
    seen: dict[Any, Any] = {}

    def convert(value: Any) -> Any:
        key = (type(value), value)  # True and 1 are equal keys, but not the same value
        try:
            return seen[key]
        except KeyError:
            converted = seen[key] = process(value)
            return converted
        except TypeError:  # unhashable (a JSON payload): converted every time
            return process(value)

    return convert
