"""Peer libraries, driven through their public APIs only.

Each adapter offers the same operations (create its schema, enqueue one at a time,
enqueue in bulk, fill a backlog of due jobs, drain it, empty it), or raises
:class:`~bench.results.NotAvailable` saying exactly why it cannot. Filling a backlog is
setup, not a measurement, and uses each library's fastest public path.
"""

from __future__ import annotations

from typing import Protocol

from ..results import Sample


class Peer(Protocol):
    """What the suites need of a peer library."""

    label: str

    def enqueue_each(self, count: int, delay_seconds: float) -> int: ...

    def enqueue_bulk(self, count: int, delay_seconds: float) -> int: ...

    def fill_due(self, count: int) -> None: ...

    def drain(self, expected: int) -> Sample:
        """Run every due job; timed from the call to the last acknowledgement."""

    def clear(self) -> None: ...

    def close(self) -> None: ...
