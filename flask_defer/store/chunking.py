"""Batches cut into statements a database accepts, by the size of their large values.

Both databases refuse one bound value over 1 GB (SQLite's longest string or blob,
PostgreSQL's longest field, an array parameter included), and job results have no
size bound. A batch whose values together could pass that goes in several statements
of one transaction, each carrying about a budget's worth; the usual batch of small
values stays one statement.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")

#: What each item adds to a statement besides its large values (ids, times, names).
ITEM_OVERHEAD = 128


def runs_by_size(
    items: Sequence[T], budget: int, size_of: Callable[[T], int]
) -> Iterator[Sequence[T]]:
    """*items* in runs whose sizes (*size_of* each item's large values, plus
    :data:`ITEM_OVERHEAD`) add up to about *budget* bytes, each run at least one item."""
    start, size = 0, 0
    for i, item in enumerate(items):
        cost = size_of(item) + ITEM_OVERHEAD
        if size and size + cost > budget:
            yield items[start:i]
            start, size = i, 0
        size += cost
    yield items[start:]
