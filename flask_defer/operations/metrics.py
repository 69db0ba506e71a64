"""Prometheus metrics of one app: the jobs table's figures, and the runs of this process.

Two kinds of figures share one registry, the app's own (never prometheus_client's
global one, so two apps in a process, or a test suite, never collide):

* **The table**, read at scrape time from ``defer.health()``: jobs by status and name,
  scheduled and owed work, the oldest owed job's age, lapsed leases, jobs waiting for
  an unknown handler. Every process reports the same values (aggregate with ``max``).
* **Runs**, observed from the blinker signals as they happen in *this* process: run
  durations, lateness (start − ``run_at``) and failed attempts. A worker process runs
  the jobs, so it serves these itself (``flask defer worker --metrics-port``);
  aggregate them across processes with ``sum``.

prometheus_client is an optional dependency (``flask-defer-jobs[metrics]``), imported only
when ``DEFER_METRICS`` is on.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from .. import signals
from ..errors import NotConfigured
from ..jobs import Job
from ..timeutil import utcnow
from .health import Health

#: Seconds a handler ran: from a few milliseconds to the default 10-minute timeout.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600)
#: Seconds between a job's run_at and its start: sub-second is the promise, an hour is
#: an outage.
LATENESS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
#: Start times kept for runs whose end was never signalled (a lost lease sends
#: nothing); the oldest are forgotten beyond this, so the map cannot grow forever.
MAX_IN_FLIGHT = 10_000


def import_prometheus() -> Any:
    """prometheus_client, or a :class:`NotConfigured` error that says how to get it."""
    try:
        import prometheus_client
    except ImportError:
        raise NotConfigured(
            "DEFER_METRICS = True needs prometheus_client: "
            "pip install 'flask-defer-jobs[metrics]' (or set DEFER_METRICS = False)"
        ) from None
    return prometheus_client


class Metrics:
    """The metrics registry of one app, fed by its signals and its health report."""

    def __init__(self, sender: Any, *, health: Callable[[], Health]) -> None:
        prometheus = import_prometheus()
        self.registry = prometheus.CollectorRegistry(auto_describe=False)
        self.duration = prometheus.Histogram(
            "defer_job_duration_seconds",
            "How long handlers ran, by job name and outcome (done, retry, failed).",
            ["name", "outcome"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.lateness = prometheus.Histogram(
            "defer_job_lateness_seconds",
            "How long after its run_at a job started running, by job name.",
            ["name"],
            buckets=LATENESS_BUCKETS,
            registry=self.registry,
        )
        self.failures = prometheus.Counter(
            "defer_job_failures",
            'Failed attempts by job name; final="true" when the job became a dead letter.',
            ["name", "final"],
            registry=self.registry,
        )
        self.registry.register(TableCollector(health))
        self._started: OrderedDict[tuple[int, str | None], float] = OrderedDict()
        self._lock = threading.Lock()
        # Bound methods are held weakly by blinker; the app keeps this object alive.
        signals.job_started.connect(self._on_started, sender=sender)
        signals.job_succeeded.connect(self._on_succeeded, sender=sender)
        signals.job_failed.connect(self._on_failed, sender=sender)

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """The registry in the format the scraper asked for, and its content type."""
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    def serve(self, port: int, addr: str = "127.0.0.1") -> Any:
        """Serve the registry over HTTP from a thread (the worker's ``--metrics-port``).

        Returns the server; call ``shutdown()`` and ``server_close()`` on it when done.
        """
        prometheus = import_prometheus()
        server, _thread = prometheus.start_http_server(port, addr, registry=self.registry)
        return server

    # -- signal receivers --------------------------------------------------------------

    def _on_started(self, sender: Any, job: Job, **_: Any) -> None:
        late = max((utcnow() - job.run_at).total_seconds(), 0.0)
        self.lateness.labels(job.name).observe(late)
        with self._lock:
            self._started[(job.id, job.claim_token)] = time.perf_counter()
            while len(self._started) > MAX_IN_FLIGHT:
                self._started.popitem(last=False)

    def _on_succeeded(self, sender: Any, job: Job, **_: Any) -> None:
        self._finished(job, "done")

    def _on_failed(self, sender: Any, job: Job, will_retry: bool = False, **_: Any) -> None:
        self.failures.labels(job.name, "false" if will_retry else "true").inc()
        self._finished(job, "retry" if will_retry else "failed")

    def _finished(self, job: Job, outcome: str) -> None:
        # Keyed by the claim token too: a retried job is a new claim with a new start.
        with self._lock:
            started = self._started.pop((job.id, job.claim_token), None)
        if started is not None:
            self.duration.labels(job.name, outcome).observe(time.perf_counter() - started)


class TableCollector:
    """Gauges read from the jobs table at scrape time (one grouped query)."""

    def __init__(self, health: Callable[[], Health]) -> None:
        self.health = health

    def describe(self) -> Iterable[Any]:
        """The metric names, so the registry can refuse a clash without querying."""
        return self._families()

    def collect(self) -> Iterable[Any]:
        """Read the health report and turn it into gauges."""
        jobs, scheduled, owed, oldest, lapsed, unknown = self._families()
        health = self.health()
        for item in health.by_name:
            for status, count in item.counts.items():
                jobs.add_metric([status, item.name], count)
            scheduled.add_metric([item.name], item.scheduled)
            owed.add_metric([item.name], item.owed)
            oldest.add_metric([item.name], item.oldest_owed_age or 0.0)
        lapsed.add_metric([], health.lapsed_leases)
        unknown.add_metric([], health.unknown_handlers)
        return [jobs, scheduled, owed, oldest, lapsed, unknown]

    @staticmethod
    def _families() -> list[Any]:
        from prometheus_client.core import GaugeMetricFamily

        return [
            GaugeMetricFamily(
                "defer_jobs", "Jobs in the table by status and job name.", labels=["status", "name"]
            ),
            GaugeMetricFamily(
                "defer_jobs_scheduled",
                "Pending jobs not due yet (not a backlog), by job name.",
                labels=["name"],
            ),
            GaugeMetricFamily(
                "defer_jobs_owed",
                "Jobs due and not settled (pending and due, or running), by job name.",
                labels=["name"],
            ),
            GaugeMetricFamily(
                "defer_oldest_owed_age_seconds",
                "Age of the oldest owed job since it became due (0: nothing owed), by job name.",
                labels=["name"],
            ),
            GaugeMetricFamily(
                "defer_lapsed_leases", "Running jobs whose worker stopped renewing the lease."
            ),
            GaugeMetricFamily(
                "defer_unknown_handler_jobs",
                "Pending jobs whose name has no handler here or in a worker (a deploy gap).",
            ),
        ]
