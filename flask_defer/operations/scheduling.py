"""Scheduling: every rule of writing new jobs, over one app's state.

``schedule`` checks one job against its handler's registration and writes it through
:func:`insert`, the one insert-and-signal path (features write theirs there too);
``schedule_many`` writes many keyless jobs in one statement batch; ``undoable``
schedules a job behind an Undo window. Each joins the caller's transaction. The
options every scheduling call takes are one :class:`ScheduleOptions`, relayed with
``Unpack`` by the public methods, so they are written out once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, TypedDict, Unpack

from sqlalchemy import Connection

from .. import signals
from ..errors import InvalidArgument, UnknownJob
from ..jobs import Job
from ..queue_controls import checked_priority, checked_ttl, validate_queue
from ..registry import HandlerSpec
from ..store import NewJob
from ..timeutil import Duration, as_duration, as_utc, resolve_run_at, utcnow
from ..validation import checked_actor, checked_payload_text, checked_state_texts, checked_text
from .bulk import build_new_jobs
from .state import DeferState


class ScheduleOptions(TypedDict, total=False):
    """The options of every call that schedules a job: ``schedule``, ``undoable``,
    ``schedule_http`` and ``schedule_many`` (which refuse the few that make no sense
    for them, by name)."""

    #: When it runs: an aware datetime, or after ``delay`` (a timedelta or seconds).
    run_at: datetime | None
    delay: Duration | None
    #: The intent's name; one live job per key (:class:`~flask_defer.JobExists`).
    key: str | None
    #: Swap out the pending holder of ``key`` instead of refusing.
    replace: bool
    #: Who sees it in the Undo UI, and its text there.
    owner: str | None
    label: str | None
    #: Who the job's history says scheduled it (default ``"app"``).
    actor: str | None
    #: Queue controls, each defaulting to the handler's ``@defer.job(...)`` setting.
    queue: str | None
    priority: int | None
    concurrency_key: str | None
    concurrency_limit: int | None
    expires_at: datetime | None
    ttl: Duration | None


#: The option names, for the check that refuses a misspelt one.
OPTION_NAMES = frozenset(ScheduleOptions.__annotations__)


def checked_options(options: Mapping[str, Any], *, refused: Mapping[str, str] = {}) -> None:
    """Refuse unknown option names as Python does, and those *refused* says why not."""
    for name in options:
        if name not in OPTION_NAMES:
            raise TypeError(f"got an unexpected keyword argument {name!r}")
        if name in refused and options[name] not in (None, False):
            raise InvalidArgument(name, refused[name])


def spec_for(state: DeferState, name: Any) -> HandlerSpec:
    """The registered handler of *name*; :class:`UnknownJob` if there is none."""
    if not isinstance(name, str):
        raise InvalidArgument("name", f"expected a job name string, got {name!r}")
    spec = state.registry.get(name)
    if spec is None:
        raise UnknownJob(name)
    return spec


def max_attempts(state: DeferState, spec: HandlerSpec) -> int:
    """Attempts of a job of *spec*: the handler's own, else ``DEFER_MAX_ATTEMPTS``."""
    return spec.max_attempts or state.config.max_attempts


def insert(
    state: DeferState,
    new: NewJob,
    *,
    now: datetime,
    replace: bool = False,
    conn: Connection | None = None,
    actor: str = "app",
) -> Job:
    """Write *new* (in *conn*, else joining the caller's transaction) and signal it.

    Raises :class:`~flask_defer.JobExists` when a live job holds the key and
    *replace* is False. *actor* is who the ``scheduled`` event names.
    """
    if conn is None:
        with state.transactions.joined(writes=True) as joined:
            job = state.store.insert(joined, new, now=now, replace=replace, actor=actor)
    else:
        job = state.store.insert(conn, new, now=now, replace=replace, actor=actor)
    state.send(signals.job_scheduled, job=job)
    return job


def schedule(
    state: DeferState,
    name: str,
    payload: Any = None,
    *,
    undo_until: datetime | None = None,
    texts: Mapping[str, str | None] | None = None,
    **options: Unpack[ScheduleOptions],
) -> Job:
    """Validate and insert one job (what ``Defer.schedule`` documents).

    *texts* are an Undo toast's state texts (``done_label=`` ...), from ``undoable``.
    """
    checked_options(options)
    spec = spec_for(state, name)
    now = utcnow()
    when = resolve_run_at(
        options.get("run_at"), options.get("delay"), now,
        strict=state.config.strict_local_times,
    )  # fmt: skip
    value, text = checked_payload_text(payload, max_bytes=state.config.max_payload_bytes)
    new = NewJob(
        name=name,
        payload=value,
        payload_json=text,
        run_at=when,
        max_attempts=max_attempts(state, spec),
        **spec.controls(
            run_at=when,
            queue=options.get("queue"),
            priority=options.get("priority"),
            ttl=options.get("ttl"),
            concurrency_key=options.get("concurrency_key"),
            concurrency_limit=options.get("concurrency_limit"),
            expires_at=options.get("expires_at"),
        ),
        key=checked_text(options.get("key"), "key"),
        owner=checked_text(options.get("owner"), "owner"),
        label=checked_text(options.get("label"), "label"),
        undo_until=as_utc(undo_until, "undo_until") if undo_until is not None else None,
        **checked_state_texts(texts),
    )
    replace = options.get("replace", False)
    if not isinstance(replace, bool):
        raise InvalidArgument("replace", f"expected True or False, got {replace!r}")
    return insert(state, new, now=now, replace=replace, actor=checked_actor(options.get("actor")))


#: What ``schedule_many`` refuses of the common options, and why.
BULK_REFUSES = {
    "key": "bulk jobs have no key; schedule keyed intents with schedule()",
    "replace": "bulk jobs have no key to replace; use schedule()",
    "concurrency_key": "a per-key concurrency limit needs schedule()",
    "concurrency_limit": "a per-key concurrency limit needs schedule()",
    "expires_at": "give ttl=, measured from each job's run_at",
}


def schedule_many(
    state: DeferState,
    name: str,
    payloads: Iterable[Any],
    **options: Unpack[ScheduleOptions],
) -> int:
    """Validate every item, then insert them in one batch joining the caller's transaction.

    ``run_at``, ``delay``, ``owner`` and ``label`` apply to the items that do not set
    their own; ``queue``, ``priority`` and ``ttl`` to every job; the options of keyed
    jobs are refused (:data:`BULK_REFUSES`).
    """
    checked_options(options, refused=BULK_REFUSES)
    spec = spec_for(state, name)
    priority, ttl, queue = options.get("priority"), options.get("ttl"), options.get("queue")
    level = spec.priority if priority is None else checked_priority(priority)
    span = checked_ttl(ttl) if ttl is not None else spec.ttl
    if queue is not None:
        validate_queue(queue)
    now = utcnow()
    jobs = build_new_jobs(
        payloads,
        name=name,
        queue=queue if queue is not None else spec.queue,
        max_attempts=max_attempts(state, spec),
        now=now,
        run_at=options.get("run_at"),
        delay=options.get("delay"),
        owner=options.get("owner"),
        label=options.get("label"),
        max_payload_bytes=state.config.max_payload_bytes,
        strict_local_times=state.config.strict_local_times,
        priority=level,
        ttl=span,
    )
    if not jobs:
        return 0
    actor = checked_actor(options.get("actor"))
    with state.transactions.joined(writes=True) as conn:
        return state.store.insert_many(conn, jobs, now=now, actor=actor)


#: What ``undoable`` refuses of the common options, and why.
UNDOABLE_REFUSES = {
    "run_at": "an undoable job runs when its Undo window closes; give window=",
    "delay": "an undoable job runs when its Undo window closes; give window=",
}


def undoable(
    state: DeferState,
    name: str,
    payload: Any,
    *,
    window: Duration | None,
    texts: dict[str, str | None] | None = None,
    **options: Unpack[ScheduleOptions],
) -> Job:
    """Schedule *name* after an Undo window (plus the margin), with a toast for its owner.

    *texts* are the toast's state texts (``waiting_label``, ``done_label``, ...), each
    stored in its own column.
    """
    checked_options(options, refused=UNDOABLE_REFUSES)
    span = (
        state.config.undo_window
        if window is None
        else as_duration(window, "window", allow_zero=False)
    )
    if options.get("owner") is None:
        raise InvalidArgument(
            "owner",
            "there is no current owner to show the Undo toast to; call undoable() "
            "while handling a request, or pass owner=",
        )
    now = utcnow()
    timed: ScheduleOptions = {**options, "run_at": now + span + state.config.undo_margin}
    return schedule(state, name, payload, undo_until=now + span, texts=texts, **timed)
