"""OpenTelemetry, when the app has it (``pip install flask-defer-jobs[otel]``).

``schedule()`` inside an active span makes a ``defer.schedule <name>`` span (kind
PRODUCER) and stores that span's W3C trace context (``traceparent``, ``tracestate``)
in the job's row; the worker runs the job in a ``defer.run <name>`` span (kind
CONSUMER) in the same trace, with the messaging attributes (``messaging.system``,
``messaging.destination.name``: the queue, ``messaging.message.id``: the job id) and
the attempt; a failed run records its exception and an error status.

Parent or link? A job due soon after it was scheduled (within
:data:`PARENT_WITHIN`) is part of the request's story: its run is a child of the
schedule span, so the trace shows the request, the enqueue and the run as one tree. A
job due later (a reminder next week, a deadline months away) gets a span of its own
trace, *linked* to the schedule span: a trace that spanned months would be unreadable,
and most backends drop its late spans anyway.

Without OpenTelemetry installed nothing here imports it: :data:`TRACER` is None and
both hooks return at once (one ``is None`` test per call). With the API installed but
no tracer provider set (no SDK configured: every span would be a non-recording no-op),
neither ``schedule()`` nor a run makes a span or stores a context: both ask
:func:`recording` first, so nobody pays per job for tracing nobody records (the drain
lost 4-5 % to the no-op spans before this check).
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import timedelta
from typing import Any

from .jobs import Job, NotYet

#: A job due within this long of its scheduling runs as a child of the schedule span;
#: a later one in a trace of its own, linked to it.
PARENT_WITHIN = timedelta(hours=1)
#: ``messaging.system`` of every span.
SYSTEM = "flask_defer"


def _tracer() -> Any:
    if importlib.util.find_spec("opentelemetry") is None:
        return None
    try:
        from opentelemetry import trace
    except ImportError:  # a leftover namespace folder, or a distribution without the API
        return None
    return trace.get_tracer("flask_defer")


#: The tracer, or None when OpenTelemetry is not installed (then nothing is imported).
TRACER: Any = _tracer()


@contextmanager
def scheduling(name: str, queue: str) -> Iterator[dict[str, str] | None]:
    """Inside an active span: a ``defer.schedule <name>`` span around the insert,
    yielding its trace context to store with the job; None outside a span, or without
    OpenTelemetry (then no span either)."""
    if TRACER is None:
        yield None
        return
    from opentelemetry import propagate, trace

    if not trace.get_current_span().get_span_context().is_valid:
        yield None
        return
    with TRACER.start_as_current_span(
        f"defer.schedule {name}",
        kind=trace.SpanKind.PRODUCER,
        attributes={
            "messaging.system": SYSTEM,
            "messaging.operation.type": "create",
            "messaging.destination.name": queue,
        },
    ):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield carrier or None


#: What a run is wrapped in without OpenTelemetry: one shared, reusable no-op.
NO_SPAN: AbstractContextManager[Any] = nullcontext()


def run_span(job: Job) -> AbstractContextManager[Any]:
    """The context manager a run is wrapped in: :func:`running`, or :data:`NO_SPAN`
    without OpenTelemetry or while it records nothing (:func:`recording`)."""
    return running(job) if recording() else NO_SPAN


#: How often a process without a tracer provider looks again for one set since.
PROVIDER_LOOK_SECONDS = 1.0
_provider_seen = False
_next_provider_look = 0.0


def recording() -> bool:
    """Whether a span made now could be recorded: OpenTelemetry is installed and
    either :data:`TRACER` is a tracer of a real provider, or it is the API's proxy
    and the app has set a tracer provider since (the proxy then delegates to it; a
    provider set while the process runs is seen within :data:`PROVIDER_LOOK_SECONDS`).
    The proxy before that makes non-recording spans only: nothing to pay for."""
    global _provider_seen, _next_provider_look
    tracer = TRACER
    if tracer is None:
        return False
    api = sys.modules["opentelemetry.trace"]  # imported with TRACER: one dict look-up
    if not isinstance(tracer, api.ProxyTracer) or _provider_seen:
        return True
    # The API's look-up reads os.environ each time while no provider is set: asked at
    # most every PROVIDER_LOOK_SECONDS, and never again once one is (it stays).
    now = time.monotonic()
    if now < _next_provider_look:
        return False
    _next_provider_look = now + PROVIDER_LOOK_SECONDS
    _provider_seen = not isinstance(api.get_tracer_provider(), api.ProxyTracerProvider)
    return _provider_seen


@contextmanager
def running(job: Job) -> Iterator[Any]:
    """The ``defer.run <name>`` span around one attempt (a no-op without OpenTelemetry,
    or for a job scheduled outside any span: then a fresh trace of its own)."""
    if TRACER is None:
        yield None
        return
    from opentelemetry import propagate, trace

    context = None
    links = []
    if job.trace_context:
        scheduled_in = propagate.extract(job.trace_context)
        parent = trace.get_current_span(scheduled_in).get_span_context()
        created = job.created_at or job.run_at
        if job.due_at - created <= PARENT_WITHIN:
            context = scheduled_in
        elif parent.is_valid:
            links = [trace.Link(parent)]
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.destination.name": job.queue,
        "messaging.message.id": str(job.id),
        "flask_defer.attempt": job.attempts,
        "flask_defer.job.name": job.name,
    }
    with TRACER.start_as_current_span(
        f"defer.run {job.name}",
        context=context,
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except NotYet:
            raise  # not a failure: the job runs later, attempt not spent
        except BaseException as error:
            from opentelemetry.trace import Status, StatusCode

            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:200]))
            raise
