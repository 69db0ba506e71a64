"""Build a contender's state on first use, so a peer that cannot start is one row's note."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from ..results import NotAvailable

T = TypeVar("T")


class Lazy(Generic[T]):
    """Creates the object on first ``get()``; import errors become :class:`NotAvailable`."""

    def __init__(self, factory: Callable[[], T], what: str) -> None:
        self.factory = factory
        self.what = what
        self.value: T | None = None

    def get(self) -> T:
        if self.value is None:
            try:
                self.value = self.factory()
            except ImportError as error:
                raise NotAvailable(f"{self.what} is not installed ({error})") from None
        return self.value

    def close(self, closer: Callable[[T], None]) -> None:
        if self.value is not None:
            closer(self.value)
