"""Tests that run for many seconds start first, one share at the head of each process's.

The suite is bound by CPU, and pytest-xdist's ``worksteal`` hands each test process one
contiguous share of the collection, then moves tests from the end of a busy process's
queue to an idle one. A test that runs for a minute and happens to come late keeps its
process busy after the others have run out of work: the end of a run measured on two
cores had 45 s with one core or more idle. Dealt out to the heads of the shares, the
long tests (marked ``long`` or ``slow``) start at once, in every process, and the short
ones fill in around them.
"""

from __future__ import annotations

import pytest

#: Markers of the tests that run for many seconds.
LONG_MARKERS = ("long", "slow")


def long_tests_first(items: list[pytest.Item], processes: int) -> None:
    """Reorder *items* in place: the long tests at the heads of *processes* equal shares.

    Every process collects and reorders alike (xdist checks that the collections are the
    same), so the order depends on nothing but the items and the process count.
    """
    long = [item for item in items if any(item.get_closest_marker(m) for m in LONG_MARKERS)]
    if not long:
        return
    chosen = {id(item) for item in long}
    rest = [item for item in items if id(item) not in chosen]
    processes = max(processes, 1)
    ordered: list[pytest.Item] = []
    left = len(items)
    for process in range(processes):
        # worksteal's first split: what is left, divided by the processes left.
        share = left // (processes - process)
        heads = long[process::processes]
        fill = max(share - len(heads), 0)
        ordered += heads + rest[:fill]
        rest = rest[fill:]
        left -= share
    ordered += rest
    items[:] = ordered
