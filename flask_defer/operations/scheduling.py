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
from contextlib import nullcontext
from dataclasses import replace as dataclass_replace
from datetime import datetime
from typing import Any, TypedDict, Unpack

from sqlalchemy import Connection

from .. import signals, tracing
from ..errors import InvalidArgument, UnknownJob
from ..jobs import Job
from ..queue_controls import checked_priority, checked_ttl, validate_queue
from ..registry import HandlerSpec
from ..store import NewJob
from ..store.dependencies import MAX_PARENTS
from ..store.schema import AFTER_POLICIES
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
    #: Run only after these jobs (a Job, an id, or a list of them) settle; with
    #: ``after_policy="done"`` (the default) only if every one of them ended done.
    after: Any
    after_policy: str | None
    #: A rate-limited handler's bucket within its limit (per tenant, per provider).
    rate_key: str | None


#: The option names, for the check that refuses a misspelt one.
OPTION_NAMES = frozenset(ScheduleOptions.__annotations__)

#: A child's parents (ids, in the order given) and its policy, as checked.
After = tuple[list[int], str]


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
    after: After | None = None,
) -> Job:
    """Write *new* (in *conn*, else joining the caller's transaction) and signal it.

    Raises :class:`~flask_defer.JobExists` when a live job holds the key and
    *replace* is False. *actor* is who the ``scheduled`` event names. *after*
    (:func:`checked_after`'s answer) makes it wait for those parents, in the same
    transaction; :class:`~flask_defer.JobNotFound` for a parent that does not exist,
    raised before anything is written.
    """
    if conn is None:
        with state.transactions.joined(writes=True) as joined:
            return insert(
                state, new, now=now, replace=replace, conn=joined, actor=actor, after=after
            )
    if after is not None:
        # Before the insert: an unknown parent must leave nothing written, even in a
        # transaction the caller goes on to commit.
        state.store.check_parents(conn, after[0])
    job = state.store.insert(conn, new, now=now, replace=replace, actor=actor)
    if after is not None:
        parents, policy = after
        job = state.store.attach(conn, job, parents, policy, now=now, actor=actor)
    state.send(signals.job_scheduled, job=job)
    return job


def checked_after(after: Any, policy: Any, *, name: str = "after") -> After | None:
    """*after* (a Job, an id, or an iterable of them) and *policy*, checked; None when
    there is no parent (``after=None`` or an empty list).

    :class:`~flask_defer.InvalidArgument` names *name* (or ``after_policy``) for a
    value that is not a job or a positive id, more than ``MAX_PARENTS`` parents, or a
    policy other than ``"done"`` or ``"settled"``.
    """
    if policy is None:
        policy = "done"
    if policy not in AFTER_POLICIES:
        raise InvalidArgument(
            "after_policy" if name == "after" else "on",
            f"expected 'done' or 'settled', got {policy!r}",
        )
    if after is None:
        return None
    items = [after] if isinstance(after, Job | int) else after
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
        raise InvalidArgument(name, f"expected a Job, a job id or a list of them, got {after!r}")
    ids: list[int] = []
    for item in items:
        job_id = item.id if isinstance(item, Job) else item
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1:
            raise InvalidArgument(name, f"expected a Job or a positive job id, got {item!r}")
        ids.append(job_id)
    ids = list(dict.fromkeys(ids))
    if len(ids) > MAX_PARENTS:
        raise InvalidArgument(
            name, f"at most {MAX_PARENTS:,} parents, got {len(ids):,}"
        )
    return (ids, policy) if ids else None


def schedule(
    state: DeferState,
    name: str,
    payload: Any = None,
    *,
    undo_until: datetime | None = None,
    texts: Mapping[str, str | None] | None = None,
    conn: Connection | None = None,
    **options: Unpack[ScheduleOptions],
) -> Job:
    """Validate and insert one job (what ``Defer.schedule`` documents).

    *texts* are an Undo toast's state texts (``done_label=`` ...), from ``undoable``.
    *conn*: write in this transaction (a group's), else join the caller's.
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
            rate_key=options.get("rate_key"),
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
    after = checked_after(options.get("after"), options.get("after_policy"))
    actor = checked_actor(options.get("actor"))
    if not tracing.recording():
        return insert(state, new, now=now, replace=replace, conn=conn, actor=actor, after=after)
    with tracing.scheduling(name, new.queue) as context:
        return _insert_traced(
            state, new, context, conn=conn, now=now, replace=replace, actor=actor, after=after
        )


def _insert_traced(
    state: DeferState, new: NewJob, context: Any, *, conn: Connection | None, **args: Any
) -> Job:
    """:func:`insert`, with the caller's trace *context* kept on the row (None: none)."""
    if context is None:
        return insert(state, new, conn=conn, **args)
    joined = nullcontext(conn) if conn is not None else state.transactions.joined(writes=True)
    with joined as traced:
        job = insert(state, new, conn=traced, **args)
        state.store.set_trace_context(traced, job.id, context)
    return dataclass_replace(job, trace_context=context)


#: What ``schedule_many`` refuses of the common options, and why.
BULK_REFUSES = {
    "key": "bulk jobs have no key; schedule keyed intents with schedule()",
    "replace": "bulk jobs have no key to replace; use schedule()",
    "concurrency_key": "a per-key concurrency limit needs schedule()",
    "concurrency_limit": "a per-key concurrency limit needs schedule()",
    "expires_at": "give ttl=, measured from each job's run_at",
    "after": "jobs that wait for others need schedule(), or defer.group() for a callback",
    "after_policy": "jobs that wait for others need schedule()",
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
        if spec.rate_limit is None:
            return state.store.insert_many(conn, jobs, now=now, actor=actor)
        # A rate-limited handler's jobs carry their bucket, which the bulk statement
        # does not write: one insert each, in the same transaction.
        bucket = spec.rate_fields()
        for new in jobs:
            state.store.insert(conn, dataclass_replace(new, **bucket), now=now, replace=False,
                               actor=actor)  # fmt: skip
        return len(jobs)


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
