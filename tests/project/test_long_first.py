"""The order the test processes get their shares in (``tests/long_first``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import pytest

from ..long_first import long_tests_first


@dataclass
class Named:
    """Stands in for a collected test: a name and whether it is marked long."""

    name: str
    long: bool = False

    def get_closest_marker(self, name: str) -> object | None:
        return object() if self.long and name == "long" else None


def shares(items: list[Any], processes: int) -> list[list[str]]:
    """The contiguous shares worksteal hands out first: what is left over those left."""
    out, left = [], list(items)
    for process in range(processes):
        size = len(left) // (processes - process)
        out.append([item.name for item in left[:size]])
        left = left[size:]
    return out


def test_the_long_tests_head_every_processs_share_and_no_test_is_lost() -> None:
    items = [Named(f"t{n}", long=n in (3, 7, 8, 20)) for n in range(25)]
    reordered: list[Any] = list(items)
    long_tests_first(cast(list[pytest.Item], reordered), 3)
    assert sorted(item.name for item in reordered) == sorted(item.name for item in items)
    assert [item.name for item in reordered].count("t3") == 1
    heads = shares(reordered, 3)
    assert [share[:2] for share in heads] == [["t3", "t20"], ["t7", "t9"], ["t8", "t16"]]
    assert [len(share) for share in heads] == [8, 8, 9]
    # The short tests keep their order.
    short = [item.name for item in reordered if not item.long]
    assert short == [item.name for item in items if not item.long]


def test_in_one_process_the_long_tests_simply_come_first() -> None:
    items: list[Any] = [Named("a"), Named("b", long=True), Named("c")]
    long_tests_first(cast(list[pytest.Item], items), 1)
    assert [item.name for item in items] == ["b", "a", "c"]
