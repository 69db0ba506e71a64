"""OpenTelemetry on both backends, with the SDK's in-memory exporter: ``schedule()`` in a
span stores its trace context, and the run is a ``defer.run <name>`` span (CONSUMER)
in that trace (child when due soon, linked when due much later), with the messaging
attributes; a failure is recorded on the span."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from flask_defer import Job, tracing
from flask_defer.timeutil import utcnow

from ..conftest import AppKit
from ..engine.test_worker import MakeKit, make_kit
from ..worker_helpers import wait_until, worker_thread

__all__ = ["make_kit"]

EXPORTER = InMemorySpanExporter()
PROVIDER = TracerProvider()
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))


@pytest.fixture(autouse=True)
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """flask_defer's tracer on a provider of the test's own, exporting to memory."""
    monkeypatch.setattr(tracing, "TRACER", PROVIDER.get_tracer("flask_defer"))
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


@pytest.fixture
def kit(make_kit: MakeKit) -> AppKit:
    kit = make_kit()

    @kit.defer.job("send", queue="mail", max_attempts=1)
    def send(job: Job) -> None:
        if job.payload.get("fail"):
            raise RuntimeError("smtp said no")

    return kit


def named(exporter: InMemorySpanExporter, name: str) -> list[object]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_a_job_scheduled_in_a_request_span_runs_as_its_child(
    kit: AppKit, spans: InMemorySpanExporter
) -> None:
    tracer = PROVIDER.get_tracer("the app")
    with tracer.start_as_current_span("POST /messages/7/send") as request_span:
        job = kit.defer.schedule("send", {"n": 1})
        kit.db.session.commit()
    assert job.trace_context is not None and "traceparent" in job.trace_context
    assert kit.defer.get(job.id).trace_context == job.trace_context  # type: ignore[union-attr]
    kit.defer.run_due()
    (produced,) = named(spans, "defer.schedule send")
    (consumed,) = named(spans, "defer.run send")
    trace_id = request_span.get_span_context().trace_id
    assert produced.kind is SpanKind.PRODUCER and produced.context.trace_id == trace_id
    assert consumed.kind is SpanKind.CONSUMER and consumed.context.trace_id == trace_id
    assert consumed.parent is not None and consumed.parent.span_id == produced.context.span_id
    expected = {
        "messaging.system": "flask_defer",
        "messaging.destination.name": "mail",
        "messaging.message.id": str(job.id),
        "flask_defer.attempt": 1,
    }
    assert expected.items() <= dict(consumed.attributes).items()
    assert consumed.status.status_code is StatusCode.UNSET


def test_a_job_due_much_later_runs_in_its_own_trace_linked_to_the_schedule(
    kit: AppKit, spans: InMemorySpanExporter
) -> None:
    with PROVIDER.get_tracer("the app").start_as_current_span("POST /remind"):
        job = kit.defer.schedule("send", {"n": 2}, delay=timedelta(days=2))
        kit.db.session.commit()
    kit.defer.run_due(now=utcnow() + timedelta(days=2, seconds=1))
    (produced,) = named(spans, "defer.schedule send")
    (consumed,) = named(spans, "defer.run send")
    assert consumed.context.trace_id != produced.context.trace_id
    assert [link.context.span_id for link in consumed.links] == [produced.context.span_id]
    assert job.id


def test_a_failed_run_is_recorded_on_its_span_and_outside_a_span_nothing_is_stored(
    kit: AppKit, spans: InMemorySpanExporter
) -> None:
    job = kit.defer.schedule("send", {"fail": True})  # no active span
    kit.db.session.commit()
    assert job.trace_context is None
    kit.defer.run_due()
    assert named(spans, "defer.schedule send") == []
    (consumed,) = named(spans, "defer.run send")  # a trace of its own
    assert consumed.parent is None
    assert consumed.status.status_code is StatusCode.ERROR
    assert [e.name for e in consumed.events] == ["exception"]


def test_a_worker_thread_runs_the_span_too(kit: AppKit, spans: InMemorySpanExporter) -> None:
    with PROVIDER.get_tracer("the app").start_as_current_span("POST /x"):
        job = kit.defer.schedule("send", {"n": 3})
        kit.db.session.commit()
    with worker_thread(kit.defer.worker()):
        wait_until(lambda: named(spans, "defer.run send"), timeout=20)
    (consumed,) = named(spans, "defer.run send")
    assert consumed.attributes["messaging.message.id"] == str(job.id)


def test_without_a_tracer_nothing_is_stored_or_started(
    kit: AppKit, monkeypatch: pytest.MonkeyPatch, spans: InMemorySpanExporter
) -> None:
    # What an app without OpenTelemetry installed gets: TRACER is None (the module
    # never imports it then), and the hooks return at once.
    monkeypatch.setattr(tracing, "TRACER", None)
    with PROVIDER.get_tracer("the app").start_as_current_span("POST /y"):
        job = kit.defer.schedule("send", {"n": 4})
        kit.db.session.commit()
    kit.defer.run_due()
    assert job.trace_context is None
    assert [s.name for s in spans.get_finished_spans()] == ["POST /y"]


def test_the_tracing_module_imports_no_opentelemetry_when_it_is_missing() -> None:
    import subprocess
    import sys

    code = (
        "import importlib.util, sys\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name == 'opentelemetry' "
        "else real(name, *a)\n"
        "import flask_defer\n"
        "from flask_defer import tracing\n"
        "assert tracing.TRACER is None\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert trace  # the real one stays importable here


def test_with_the_api_but_no_tracer_provider_a_run_makes_no_span_until_one_is_set() -> None:
    # A fresh interpreter: the API's global provider is set once per process.
    import subprocess
    import sys

    code = (
        "from datetime import datetime, UTC\n"
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from flask_defer import Job, tracing\n"
        "job = Job(id=1, name='n', queue='default', payload={}, status='running',\n"
        "          run_at=datetime.now(UTC), due_at=datetime.now(UTC), attempts=1,\n"
        "          max_attempts=1)\n"
        "assert isinstance(tracing.TRACER, trace.ProxyTracer)\n"
        "assert not tracing.recording() and tracing.run_span(job) is tracing.NO_SPAN\n"

        "trace.set_tracer_provider(TracerProvider())\n"
        "import time; time.sleep(tracing.PROVIDER_LOOK_SECONDS)  # looked for once a second\n"
        "assert tracing.recording()\n"
        "with tracing.run_span(job) as span:\n"
        "    assert span.is_recording() and span.name == 'defer.run n', span\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
