"""Prometheus metrics (``DEFER_METRICS``), on SQLite and PostgreSQL.

The endpoint's text is read back with prometheus_client's own parser, so what is
checked is what a Prometheus server would see.
"""

from __future__ import annotations

import sys
import urllib.request
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from flask_defer import Job, NotConfigured
from flask_defer.store import NewJob

from ..conftest import AppKit
from ..dashboard_app import OpsApp, create_app, seed


@pytest.fixture
def make_ops(database_url: str) -> Iterator[Callable[..., OpsApp]]:
    made: list[OpsApp] = []

    def make(**options: Any) -> OpsApp:
        options.setdefault("DEFER_METRICS", True)
        ops = create_app(database_url, TESTING=True, **options)
        made.append(ops)
        return ops

    yield make
    for ops in made:
        ops.dispose()


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample, by name and sorted labels, parsed by prometheus_client."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], metric: str, /, **labels: str) -> float:
    return samples[(metric, tuple(sorted(labels.items())))]


def admin_get(ops: OpsApp, path: str, **kwargs: Any) -> Any:
    client = ops.app.test_client()
    client.get("/login/admin")
    return client.get(path, **kwargs)


def test_the_metrics_endpoint_parses_and_tells_the_table_and_the_runs(
    make_ops: Callable[..., OpsApp],
) -> None:
    ops = make_ops()
    seed(ops)
    response = admin_get(ops, "/defer/metrics")
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=")
    assert response.headers["Cache-Control"] == "no-store"
    samples = scrape(response.get_data(as_text=True))

    # The table: counts by status and name, scheduled, owed, oldest owed.
    assert value(samples, "defer_jobs", status="failed", name="sync_invoices") == 1
    assert value(samples, "defer_jobs", status="done", name="send_email") == 3
    assert value(samples, "defer_jobs", status="running", name="publish_post") == 1
    assert value(samples, "defer_jobs", status="cancelled", name="close_booking") == 1
    assert value(samples, "defer_jobs_owed", name="send_email") == 2
    assert value(samples, "defer_jobs_owed", name="publish_post") == 1
    assert value(samples, "defer_jobs_scheduled", name="close_booking") == 1
    assert 240 <= value(samples, "defer_oldest_owed_age_seconds", name="send_email") < 300
    assert value(samples, "defer_oldest_owed_age_seconds", name="close_booking") == 0
    assert value(samples, "defer_lapsed_leases") == 0
    assert value(samples, "defer_unknown_handler_jobs") == 0

    # The runs this process saw: durations, lateness, failed attempts.
    runs = "defer_job_duration_seconds_count"
    assert value(samples, runs, name="send_email", outcome="done") == 3
    assert value(samples, runs, name="sync_invoices", outcome="retry") == 2
    assert value(samples, runs, name="sync_invoices", outcome="failed") == 1
    assert value(samples, "defer_job_lateness_seconds_count", name="send_email") == 3
    assert value(samples, "defer_job_failures_total", name="sync_invoices", final="false") == 2
    assert value(samples, "defer_job_failures_total", name="sync_invoices", final="true") == 1


def test_lateness_is_measured_from_run_at_to_the_start(make_ops: Callable[..., OpsApp]) -> None:
    ops = make_ops()
    with ops.context():
        on_time = ops.defer.schedule("publish_post", {"post_id": 1})
        ops.db.session.commit()
        # A job that fell due two hours ago and nobody ran: it starts two hours late.
        # (Through the store: schedule() clamps a past run_at to now.)
        two_hours_ago = on_time.run_at - timedelta(hours=2)
        with ops.defer.store.begin() as conn:
            ops.defer.store.insert(
                conn,
                NewJob(name="close_booking", payload={}, run_at=two_hours_ago, max_attempts=1),
                now=two_hours_ago,
                replace=False,
            )
        assert ops.defer.run_due().done == 2
    samples = scrape(admin_get(ops, "/defer/metrics").get_data(as_text=True))
    late = {"name": "close_booking"}
    assert value(samples, "defer_job_lateness_seconds_bucket", le="3600.0", **late) == 0
    assert value(samples, "defer_job_lateness_seconds_bucket", le="+Inf", **late) == 1
    assert value(samples, "defer_job_lateness_seconds_sum", **late) >= 7200
    prompt = {"name": "publish_post"}
    assert value(samples, "defer_job_lateness_seconds_bucket", le="60.0", **prompt) == 1


def test_metrics_are_closed_like_the_dashboard_unless_public(
    make_ops: Callable[..., OpsApp],
) -> None:
    ops = make_ops()
    anonymous = ops.app.test_client()
    assert anonymous.get("/defer/metrics").status_code == 403
    public = make_ops(DEFER_METRICS_PUBLIC=True)
    response = public.app.test_client().get("/defer/metrics")
    assert response.status_code == 200
    assert "defer_jobs" in response.get_data(as_text=True)
    assert public.app.test_client().get("/defer/").status_code == 403  # only the metrics


def test_without_defer_metrics_there_is_no_endpoint(make_ops: Callable[..., OpsApp]) -> None:
    ops = make_ops(DEFER_METRICS=False)
    assert admin_get(ops, "/defer/metrics").status_code == 404
    with ops.context():
        assert ops.app.extensions["defer"].metrics is None


def test_openmetrics_is_served_when_asked_for(make_ops: Callable[..., OpsApp]) -> None:
    ops = make_ops()
    response = admin_get(
        ops, "/defer/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert response.headers["Content-Type"].startswith("application/openmetrics-text")
    assert response.get_data(as_text=True).rstrip().endswith("# EOF")


def test_each_app_has_its_own_registry(make_ops: Callable[..., OpsApp]) -> None:
    first, second = make_ops(), make_ops()
    with first.context():
        first.defer.schedule("send_email", {"to": "a@example.com"})
        first.db.session.commit()
        assert first.defer.run_due().done == 1
    one = scrape(admin_get(first, "/defer/metrics").get_data(as_text=True))
    two = scrape(admin_get(second, "/defer/metrics").get_data(as_text=True))
    key = ("defer_job_duration_seconds_count", (("name", "send_email"), ("outcome", "done")))
    assert one[key] == 1 and key not in two
    assert "defer_job_duration_seconds" not in prometheus_client.REGISTRY._names_to_collectors


def test_a_missing_prometheus_client_is_a_clear_error(
    make_app: Callable[..., AppKit], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(NotConfigured, match=r"pip install 'flask-defer-jobs\[metrics\]'"):
        make_app(DEFER_METRICS=True)


def test_the_metrics_settings_must_be_booleans(make_app: Callable[..., AppKit]) -> None:
    with pytest.raises(ValueError, match="DEFER_METRICS_PUBLIC"):
        make_app(DEFER_METRICS_PUBLIC="yes")


def test_a_worker_serves_its_metrics_on_a_port(make_ops: Callable[..., OpsApp]) -> None:
    ops = make_ops()

    @ops.defer.job("ping")
    def ping(job: Job) -> None:
        pass

    result = ops.app.test_cli_runner().invoke(
        args=["defer", "worker", "--burst", "--metrics-port", "0"]
    )
    assert result.exit_code == 0, result.output
    assert "metrics on http://127.0.0.1:" in result.output
    with ops.context():
        ops.defer.schedule("ping")
        ops.db.session.commit()
        metrics = ops.app.extensions["defer"].metrics
        server = metrics.serve(0)
        try:
            assert ops.defer.run_due().done == 1
            url = f"http://127.0.0.1:{server.server_port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as response:
                text = response.read().decode()
        finally:
            server.shutdown()
            server.server_close()
    samples = scrape(text)
    assert value(samples, "defer_job_duration_seconds_count", name="ping", outcome="done") == 1
    assert value(samples, "defer_jobs", status="done", name="ping") == 1


def test_the_worker_refuses_a_metrics_port_without_defer_metrics(
    make_ops: Callable[..., OpsApp],
) -> None:
    ops = make_ops(DEFER_METRICS=False)
    result = ops.app.test_cli_runner().invoke(
        args=["defer", "worker", "--burst", "--metrics-port", "0"]
    )
    assert result.exit_code == 2
    assert "--metrics-port needs DEFER_METRICS = True" in result.output
