"""What an app declares by name: its handlers and its undo hooks.

``@defer.job(...)`` records a handler that the worker looks up by the job's name.
``@defer.on_undo("name")`` records a hook that runs in the transaction that cancels a
job of that name: cancelling "send this email" needs nothing more than the guarded
cancel, but cancelling "purge this project" must also bring the project back, and
both must happen together or not at all (a hook that raises rolls the cancel back;
with ``commit=False`` the caller's transaction holds both, and the caller rolls back).
An operator's cancel (``defer.cancel(..., actor=...)``: the dashboard, ``flask defer
cancel``) runs the same hooks: for the app, a job an operator stopped is as undone as
one its owner took back. The app's own ``defer.cancel()`` without an actor runs none.
"""

from __future__ import annotations

import inspect
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from .errors import InvalidArgument
from .jobs import Job
from .queue_controls import (
    RateLimit,
    checked_concurrency_limit,
    checked_priority,
    checked_rate_limit,
    checked_ttl,
    rate_bucket,
    resolve_controls,
    validate_queue,
)
from .timeutil import Duration
from .validation import storable_text

Handler = Callable[[Job], Any]
F = TypeVar("F", bound=Handler)

#: ``attempts`` and ``max_attempts`` are 32-bit integer columns.
MAX_ATTEMPTS_LIMIT = 2**31 - 1

#: Longest handler timeout: what a thread wait accepts on every platform, capped at a
#: year (a timeout that never comes is a mistake, not a setting).
MAX_TIMEOUT = min(threading.TIMEOUT_MAX, 365 * 24 * 3600.0)


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
    #: Queue controls for this handler's jobs, unless ``schedule()`` gives its own.
    priority: int = 0
    concurrency_limit: int | None = None
    ttl: timedelta | None = None
    #: At most this many of its jobs start per period, across every worker.
    rate_limit: RateLimit | None = None
    # Asked twice for every job a worker runs: looked up once, not per job.
    _is_async: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_is_async", inspect.iscoroutinefunction(self.func))

    @property
    def is_async(self) -> bool:
        """True for an ``async def`` handler: the worker awaits it on its event loop."""
        return self._is_async

    def rate_fields(self) -> dict[str, Any]:
        """The ``NewJob`` fields that put a job of this handler in its rate bucket (no
        ``rate_key``); empty without a rate limit. For the jobs the library writes
        itself (recurring ticks, batches), which take no other queue controls."""
        if self.rate_limit is None:
            return {}
        return {
            "concurrency_key": rate_bucket(self.name, None),
            "rate_limit": self.rate_limit.count,
            "rate_period": self.rate_limit.period,
        }

    def controls(
        self, *, run_at: datetime, queue: Any, rate_key: Any = None, **given: Any
    ) -> dict[str, Any]:
        """The ``NewJob`` fields of one ``schedule()`` call's queue controls.

        *given* are its ``priority``, ``concurrency_key``, ``concurrency_limit``,
        ``expires_at`` and ``ttl``; what it leaves out comes from this handler. A
        rate-limited handler's job counts in its bucket (the name and *rate_key*),
        which is its ``concurrency_key``: the keyed claim, serialised across workers,
        is what holds the limit.
        """
        if queue is not None:
            validate_queue(queue)
        if self.rate_limit is None:
            if rate_key is not None:
                raise InvalidArgument(
                    "rate_key",
                    f"job {self.name!r} has no rate limit to count by; register it with "
                    "@defer.job(..., rate_limit='10/s')",
                )
        else:
            for argument in ("concurrency_key", "concurrency_limit"):
                if given.get(argument) is not None:
                    raise InvalidArgument(
                        argument,
                        f"job {self.name!r} is rate-limited ({self.rate_limit.text()}): its "
                        "concurrency key is its rate bucket; give rate_key= to split it",
                    )
            given["concurrency_key"] = rate_bucket(self.name, rate_key)
            given["concurrency_limit"] = 1  # unused: the rate decides (see claim_sql)
        controls = resolve_controls(
            run_at=run_at,
            default_priority=self.priority,
            default_concurrency_limit=self.concurrency_limit,
            default_ttl=self.ttl,
            **given,
        )
        limit = self.rate_limit
        return {
            "queue": queue if queue is not None else self.queue,
            "priority": controls.priority,
            "concurrency_key": controls.concurrency_key,
            "concurrency_limit": None if limit is not None else controls.concurrency_limit,
            "expires_at": controls.expires_at,
            "rate_limit": limit.count if limit is not None else None,
            "rate_period": limit.period if limit is not None else None,
        }


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
        priority: int = 0,
        concurrency_limit: int | None = None,
        ttl: Duration | None = None,
        rate_limit: str | None = None,
    ) -> Callable[[F], F]:
        """What ``@defer.job(name, ...)`` returns: registers the function it decorates.

        The arguments are checked now, so a mistake points at the decorator line, not
        at the first job; *name* ``None`` takes the function's name.
        """
        validate_spec(name if name is not None else "handler", max_attempts, timeout, queue, atomic)
        level = checked_priority(priority)
        limit = None if concurrency_limit is None else checked_concurrency_limit(concurrency_limit)
        span = checked_ttl(ttl)
        rate = checked_rate_limit(rate_limit)
        if rate is not None and limit is not None:
            raise InvalidArgument(
                "concurrency_limit",
                "a rate-limited handler's jobs are limited by their rate; give one of "
                "rate_limit and concurrency_limit",
            )

        def register(func: F) -> F:
            validate_handler(func)
            if atomic and inspect.iscoroutinefunction(func):
                raise InvalidArgument(
                    "atomic",
                    "an async def handler cannot be atomic=True: its awaits would hold "
                    "the job's transaction open across the event loop; use a plain def",
                )
            self.add(
                HandlerSpec(
                    name=name if name is not None else func.__name__,
                    func=func,
                    max_attempts=max_attempts,
                    timeout=float(timeout) if timeout is not None else None,
                    atomic=atomic,
                    queue=queue,
                    priority=level,
                    concurrency_limit=limit,
                    ttl=span,
                    rate_limit=rate,
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
    name: object,
    max_attempts: object,
    timeout: object,
    queue: object,
    atomic: object = False,
) -> None:
    """Check the arguments of ``@defer.job`` so mistakes surface at import time."""
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise InvalidArgument("name", f"expected a non-empty string (≤200 chars), got {name!r}")
    storable_text(name, "name")
    if max_attempts is not None and (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT
    ):
        raise InvalidArgument(
            "max_attempts",
            f"expected an integer from 1 to {MAX_ATTEMPTS_LIMIT}, got {max_attempts!r}",
        )
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        # NaN compares false with everything, so "timeout <= 0" alone lets it through
        # and the handler would never time out.
        or not math.isfinite(timeout)
        or not 0 < timeout <= MAX_TIMEOUT
    ):
        raise InvalidArgument(
            "timeout", f"expected finite seconds > 0 and ≤ {MAX_TIMEOUT:g}, got {timeout!r}"
        )
    if not isinstance(atomic, bool):
        # atomic="no" is truthy: guessing would run the handler in the wrong transaction.
        raise InvalidArgument("atomic", f"expected True or False, got {atomic!r}")
    validate_queue(queue)


def validate_handler(func: object) -> None:
    """Refuse a handler that cannot be called, at the decorator line."""
    if not callable(func):
        raise InvalidArgument("handler", f"expected a function taking the job, got {func!r}")


#: A function run with the just-cancelled job, inside the undo's transaction.
UndoHook = Callable[[Job], None]


class UndoHooks:
    """Hooks by job name, run in registration order when a job of that name is undone."""

    def __init__(self) -> None:
        self._hooks: dict[str, list[UndoHook]] = {}

    def add(self, name: str, hook: UndoHook) -> None:
        """Run *hook* whenever a pending job called *name* is undone."""
        if not isinstance(name, str) or not name:
            raise InvalidArgument("name", f"expected a job name, got {name!r}")
        if not callable(hook):
            raise InvalidArgument("hook", f"expected a callable, got {hook!r}")
        hooks = self._hooks.setdefault(name, [])
        if hook not in hooks:
            hooks.append(hook)

    def for_name(self, name: str) -> tuple[UndoHook, ...]:
        """The hooks of job *name*, in the order they were registered."""
        return tuple(self._hooks.get(name, ()))
