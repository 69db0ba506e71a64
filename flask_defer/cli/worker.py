"""``flask defer worker``: run due jobs until stopped, optionally serving metrics."""

from __future__ import annotations

import click
from flask.cli import with_appcontext

from ..facade import current_defer
from .common import errors_to_exit_codes


@click.command("worker", short_help="Run due jobs until stopped.")
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(1, 1000),
    default=None,
    help="Handler threads (default: DEFER_WORKER_CONCURRENCY).",
)
@click.option(
    "--queue",
    "-q",
    "queues",
    multiple=True,
    help="Only run jobs of this queue (repeatable; default: all queues).",
)
@click.option("--burst", is_flag=True, help="Run what is due, then exit.")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
    help="Lowest level of log line printed (any case).",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one object per line with job_id, job_name and job_key fields.",
)
# -- metrics: the worker serves the figures of the jobs it runs --
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve this worker's Prometheus metrics on this port (needs DEFER_METRICS = True).",
)
@click.option(
    "--metrics-addr",
    default="127.0.0.1",
    show_default=True,
    help="Address the metrics server listens on (0.0.0.0 for every interface).",
)
@with_appcontext
@errors_to_exit_codes
def worker_command(
    concurrency: int | None,
    queues: tuple[str, ...],
    burst: bool,
    log_level: str,
    log_format: str,
    metrics_port: int | None,
    metrics_addr: str,
) -> None:
    """Run due jobs until stopped (SIGTERM/SIGINT finish or release running jobs).

    Start as many as you like on PostgreSQL; on SQLite run one.
    """
    from ..engine.collector import startup_objects_spared_from_gc
    from ..engine.logs import configure

    configure(log_level, log_format)
    worker = current_defer().worker(concurrency=concurrency, queues=queues or None, burst=burst)
    server = None
    if metrics_port is not None:
        metrics = current_defer().metrics
        if metrics is None:
            raise click.UsageError("--metrics-port needs DEFER_METRICS = True in the app's config")
        server = metrics.serve(metrics_port, metrics_addr)
        click.echo(f"metrics on http://{metrics_addr}:{server.server_port}/metrics", err=True)
    try:
        with startup_objects_spared_from_gc():
            worker.run()
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
