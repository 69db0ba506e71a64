"""Handlers by name: what ``@defer.job(...)`` records and the worker looks up."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from .errors import InvalidArgument
from .jobs import Job

Handler = Callable[[Job], Any]
F = TypeVar("F", bound=Handler)


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """One registered handler and how its jobs are run.

    ``max_attempts`` and ``timeout`` of ``None`` mean "use the app's configured
    default"; ``atomic`` commits the handler's ``db.session`` work together with the
    job's ``done`` mark.
    """

    name: str
    func: Handler
    max_attempts: int | None = None
    timeout: float | None = None
    atomic: bool = False
    queue: str = "default"


class Registry:
    """The handlers known to this process, keyed by job name."""

    def __init__(self) -> None:
        self._specs: dict[str, HandlerSpec] = {}

    def add(self, spec: HandlerSpec) -> None:
        """Register *spec*; a second, different handler under one name is a mistake."""
        existing = self._specs.get(spec.name)
        if existing is not None and existing.func is not spec.func:
            raise InvalidArgument(
                "name",
                f"a handler is already registered for job {spec.name!r} "
                f"({existing.func.__module__}.{existing.func.__qualname__})",
            )
        self._specs[spec.name] = spec

    def decorator(
        self,
        name: str | None,
        *,
        max_attempts: int | None,
        timeout: float | None,
        atomic: bool,
        queue: str,
    ) -> Callable[[F], F]:
        """What ``@defer.job(name, ...)`` returns: registers the function it decorates.

        The arguments are checked now, so a mistake points at the decorator line, not
        at the first job; *name* ``None`` takes the function's name.
        """
        validate_spec(name if name is not None else "handler", max_attempts, timeout, queue)

        def register(func: F) -> F:
            self.add(
                HandlerSpec(
                    name=name if name is not None else func.__name__,
                    func=func,
                    max_attempts=max_attempts,
                    timeout=float(timeout) if timeout is not None else None,
                    atomic=atomic,
                    queue=queue,
                )
            )
            return func

        return register

    def get(self, name: str) -> HandlerSpec | None:
        """The handler for *name*, or ``None`` when this process does not know it."""
        return self._specs.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[HandlerSpec]:
        return iter(self._specs.values())

    def names(self) -> frozenset[str]:
        """Every registered job name."""
        return frozenset(self._specs)


def validate_spec(
    name: object, max_attempts: object, timeout: object, queue: object
) -> None:
    """Check the arguments of ``@defer.job`` so mistakes surface at import time."""
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise InvalidArgument("name", f"expected a non-empty string (≤200 chars), got {name!r}")
    if max_attempts is not None and (
        isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1
    ):
        raise InvalidArgument("max_attempts", f"expected an integer ≥ 1, got {max_attempts!r}")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        raise InvalidArgument("timeout", f"expected seconds > 0, got {timeout!r}")
    if not isinstance(queue, str) or not queue or len(queue) > 100:
        raise InvalidArgument("queue", f"expected a non-empty string (≤100 chars), got {queue!r}")
