"""``flask defer ...``: thin click commands over the facade.

Each command parses its options, calls one facade method, and prints the result. Only
here do errors become exit codes: 1 for a refused operation, 2 for bad input.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import wraps
from typing import Any, TypeVar

import click
from flask.cli import with_appcontext

from .errors import DeferError, InvalidArgument, JobNotPending
from .extension import current_defer
from .jobs import Job, JobStatus
from .store.schedules import ScheduleRow

C = TypeVar("C", bound=Callable[..., Any])

#: Who a CLI command is in the job history.
CLI_ACTOR = "cli"


def _errors_to_exit_codes(command: C) -> C:
    @wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except InvalidArgument as error:
            raise click.UsageError(str(error)) from None
        except DeferError as error:
            raise click.ClickException(str(error)) from None

    return wrapper  # type: ignore[return-value]


@click.group("defer")
def defer_cli() -> None:
    """Durable delayed jobs: install, inspect, cancel and run them."""


@defer_cli.command("install", short_help="Create or upgrade flask_defer's tables.")
@with_appcontext
@_errors_to_exit_codes
def install_command() -> None:
    """Create the jobs and schedules tables at the newest schema revision and record it
    (apps without migrations; an existing schema is upgraded). Refused in an app that
    uses Flask-Migrate or whose database has alembic_version: run `flask db upgrade`
    there."""
    defer = current_defer()
    name = defer.install()
    click.echo(f"table {name} is ready ({defer.schema_status().message})")


@defer_cli.group("db", short_help="Schema revisions: upgrade, check, print the SQL.")
def db_cli() -> None:
    """The jobs table's schema revisions: upgrade, check, or print the SQL."""


@db_cli.command("upgrade")
@with_appcontext
@_errors_to_exit_codes
def db_upgrade_command() -> None:
    """Upgrade flask_defer's schema to the newest revision (keeps every row)."""
    applied = current_defer().upgrade_schema()
    if not applied:
        click.echo("flask_defer schema is already current")
    for revision in applied:
        click.echo(f"applied {revision}")


@db_cli.command("check")
@with_appcontext
@_errors_to_exit_codes
def db_check_command() -> None:
    """Exit 0 when the schema matches this code; 1 with the command to run otherwise."""
    status = current_defer().schema_status()
    if not status.ok:
        raise click.ClickException(status.message)
    click.echo(status.message)


@db_cli.command("sql")
@with_appcontext
@_errors_to_exit_codes
def db_sql_command() -> None:
    """Print the SQL of the pending upgrade steps without running them (for a DBA)."""
    click.echo(current_defer().schema_sql(), nl=False)


@defer_cli.command("list")
@click.option(
    "--status",
    type=click.Choice([s.value for s in JobStatus]),
    multiple=True,
    help="Only jobs in this status (repeatable: --status pending --status running).",
)
@click.option("--name", default=None, help="Only jobs with this name.")
@click.option("--key-prefix", default=None, help="Only jobs whose key starts with this.")
@click.option("--owner", default=None, help="Only jobs of this owner.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@with_appcontext
@_errors_to_exit_codes
def list_command(
    status: tuple[str, ...],
    name: str | None,
    key_prefix: str | None,
    owner: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List jobs, newest first."""
    jobs = current_defer().list(
        status=status or None, name=name, key_prefix=key_prefix, owner=owner, limit=limit
    )
    if as_json:
        for job in jobs:
            click.echo(json.dumps(_job_dict(job)))
        return
    if not jobs:
        click.echo("no jobs")
        return
    # Columns as wide as their widest cell, so every row lines up under its header.
    rows = [
        (
            str(job.id),
            job.status.value,
            f"{job.run_at:%Y-%m-%d %H:%M:%S}",
            f"{job.attempts}/{job.max_attempts}",
            job.name,
            job.key or "",
        )
        for job in jobs
    ]
    header = ("ID", "STATUS", "RUN AT (UTC)", "TRIES", "NAME", "KEY")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    right = {0, 3}  # numbers align right
    for row in [header, *rows]:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        click.echo("  ".join(cells).rstrip())


@defer_cli.command("cancel", short_help="Cancel a job by id, --key or --key-prefix.")
@click.argument("job_id", type=int, required=False)
@click.option("--key", default=None, help="Cancel the live job holding this key.")
@click.option("--key-prefix", default=None, help="Cancel every pending job under this prefix.")
@with_appcontext
@_errors_to_exit_codes
def cancel_command(job_id: int | None, key: str | None, key_prefix: str | None) -> None:
    """Cancel a pending job by id, by --key, or all under --key-prefix.

    Exits 1 when the job was no longer pending (it is running or already settled),
    2 when the arguments name no job or more than one way to find it.
    """
    defer = current_defer()
    if key_prefix is not None:
        if job_id is not None or key is not None:
            raise click.UsageError("--key-prefix cannot be combined with a JOB_ID or --key")
        outcome = defer.cancel_many(actor=CLI_ACTOR, key_prefix=key_prefix)
        click.echo(f"cancelled {outcome['cancelled']}, still running {outcome['in_flight']}")
        return
    if job_id is None and key is None:
        raise click.UsageError("say which job: give a JOB_ID, --key KEY or --key-prefix PREFIX")
    if job_id is not None and key is not None:
        raise click.UsageError("give a JOB_ID or --key, not both")
    which = f"job {job_id}" if job_id is not None else f"the job with key {key!r}"
    if defer.cancel(job_id, key=key, actor=CLI_ACTOR):
        click.echo(f"cancelled {which}")
        return
    job = defer.get(job_id) if job_id is not None else defer.get(key=key)
    status = job.status.value if job is not None else "no longer pending"
    raise click.ClickException(f"not cancelled: {which} is {status}")


@defer_cli.command("status", short_help="Show counts by status and the backlog.")
@click.option("--json", "as_json", is_flag=True, help="Print the health report as JSON.")
@click.option(
    "--max-owed", type=int, default=None, help="Exit 3 if more jobs than this are owed."
)
@click.option(
    "--max-age",
    type=float,
    default=None,
    help="Exit 3 if the oldest owed job is older than this many seconds.",
)
@click.option("--max-failed", type=int, default=None, help="Exit 3 if more jobs failed.")
@with_appcontext
@_errors_to_exit_codes
def status_command(
    as_json: bool, max_owed: int | None, max_age: float | None, max_failed: int | None
) -> None:
    """Show counts by status and the backlog; exit 3 when a given threshold is crossed."""
    health = current_defer().health()
    if as_json:
        click.echo(json.dumps(health.as_dict(), indent=2))
    else:
        for status, count in health.counts.items():
            click.echo(f"{status:<14}{count:>10}")
        click.echo(f"{'scheduled':<14}{health.scheduled:>10}")
        click.echo(f"{'owed':<14}{health.owed:>10}")
        age = "-" if health.oldest_owed_age is None else f"{health.oldest_owed_age:.1f}s"
        click.echo(f"{'oldest owed':<14}{age:>10}")
        click.echo(f"{'lapsed leases':<14}{health.lapsed_leases:>10}")
        click.echo(f"{'unknown names':<14}{health.unknown_handlers:>10}")
        if health.by_name:
            click.echo()
            click.echo(f"{'NAME':<28}{'SCHEDULED':>10}{'OWED':>8}{'OLDEST':>10}{'FAILED':>8}")
            for item in health.by_name:
                oldest = "-" if item.oldest_owed_age is None else f"{item.oldest_owed_age:.0f}s"
                flag = "  (no handler here)" if item.unknown else ""
                click.echo(
                    f"{item.name[:27]:<28}{item.scheduled:>10}{item.owed:>8}"
                    f"{oldest:>10}{item.failed:>8}{flag}"
                )
    crossed: list[str] = []
    if max_owed is not None and health.owed > max_owed:
        crossed.append(f"owed {health.owed} > {max_owed}")
    if max_age is not None and (health.oldest_owed_age or 0.0) > max_age:
        crossed.append(f"oldest owed {health.oldest_owed_age:.1f}s > {max_age:g}s")
    if max_failed is not None and health.failed > max_failed:
        crossed.append(f"failed {health.failed} > {max_failed}")
    if crossed:
        click.echo("threshold crossed: " + "; ".join(crossed), err=True)
        sys.exit(3)


@defer_cli.command("run-due", short_help="Run the jobs due now, then exit (for cron).")
@click.option(
    "--ahead",
    type=float,
    default=0.0,
    help="Also run what becomes due within this many seconds.",
)
@click.option(
    "--max-seconds",
    type=click.FloatRange(min=0, min_open=True, max=86_400 * 366),
    default=None,
    help="Stop starting jobs after this many seconds (less than the cron interval, "
    "so one run never overlaps the next); the rest waits for the next run.",
)
@with_appcontext
@_errors_to_exit_codes
def run_due_command(ahead: float, max_seconds: float | None) -> None:
    """Run every job that is due now, in this process, then exit (for cron).

    First returns jobs whose lease lapsed (a run that was killed) to pending, and keeps
    the leases of the jobs it runs renewed, as a worker does: cron alone is enough,
    and a worker beside it never runs a job twice.
    """
    now = datetime.now(UTC) + timedelta(seconds=ahead)
    summary = current_defer().run_due(now=now, max_seconds=max_seconds)
    parts = ", ".join(f"{name} {n}" for name, n in summary.counts.items() if n)
    click.echo(f"ran {summary.ran} job(s)" + (f": {parts}" if parts else ""))
    if summary.out_of_time:
        click.echo(f"stopped after --max-seconds {max_seconds:g}; more may be due")


def _job_dict(job: Job) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for name in Job.__slots__:
        value = getattr(job, name)
        data[name] = value.isoformat() if isinstance(value, datetime) else value
    data["status"] = job.status.value
    return data


# -- the worker, retention and retries --------------------------------------------


@defer_cli.command("worker", short_help="Run due jobs until stopped.")
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
@_errors_to_exit_codes
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
    from .logs import configure

    configure(log_level, log_format)
    worker = current_defer().worker(concurrency=concurrency, queues=queues or None, burst=burst)
    if metrics_port is None:
        worker.run()
        return
    metrics = current_defer().metrics
    if metrics is None:
        raise click.UsageError("--metrics-port needs DEFER_METRICS = True in the app's config")
    server = metrics.serve(metrics_port, metrics_addr)
    click.echo(f"metrics on http://{metrics_addr}:{server.server_port}/metrics", err=True)
    try:
        worker.run()
    finally:
        server.shutdown()
        server.server_close()


@defer_cli.command("prune", short_help="Delete settled jobs past their retention.")
@with_appcontext
@_errors_to_exit_codes
def prune_command() -> None:
    """Delete settled jobs past DEFER_RETENTION (failed: DEFER_FAILED_RETENTION)."""
    deleted = current_defer().prune()
    click.echo(f"pruned {deleted} settled job(s)")


@defer_cli.command("retry", short_help="Put a failed job back to pending, due now.")
@click.argument("job_id", type=int)
@with_appcontext
@_errors_to_exit_codes
def retry_command(job_id: int) -> None:
    """Put a failed job back to pending, due now, with its attempts reset.

    Exits 1 when the job is not failed.
    """
    try:
        job = current_defer().retry(job_id, actor=CLI_ACTOR)
    except JobNotPending as error:
        raise click.ClickException(
            f"not retried: job {job_id} is {error.status}; only a failed job can be retried"
        ) from None
    click.echo(f"job {job.id} is pending again")


# -- recurring schedules ---------------------------------------------------------------


@defer_cli.group("schedules", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
@with_appcontext
@_errors_to_exit_codes
def schedules_command(ctx: click.Context, as_json: bool) -> None:
    """List recurring schedules; pause or resume one."""
    if ctx.invoked_subcommand is not None:
        return
    rows = current_defer().list_recurring()
    if as_json:
        for row in rows:
            click.echo(json.dumps(_schedule_dict(row)))
        return
    if not rows:
        click.echo("no recurring schedules")
        return
    for row in rows:
        state = "orphaned" if row.orphaned else "paused" if row.paused else "active"
        last = row.last_run_at.isoformat() if row.last_run_at else "never"
        click.echo(
            f"{row.id}  {row.job_name}  {row.rule.describe()}  {state}  "
            f"next {row.next_run_at.isoformat()}  last {last}"
        )


@schedules_command.command("pause")
@click.argument("schedule_id")
@with_appcontext
@_errors_to_exit_codes
def schedules_pause_command(schedule_id: str) -> None:
    """Stop a schedule from ticking until it is resumed."""
    if current_defer().pause_recurring(schedule_id):
        click.echo(f"schedule {schedule_id} paused")
    else:
        click.echo(f"schedule {schedule_id} was already paused")


@schedules_command.command("resume")
@click.argument("schedule_id")
@with_appcontext
@_errors_to_exit_codes
def schedules_resume_command(schedule_id: str) -> None:
    """Let a paused schedule tick again, from its next tick (missed ones are not run)."""
    if current_defer().resume_recurring(schedule_id):
        click.echo(f"schedule {schedule_id} resumed")
    else:
        click.echo(f"schedule {schedule_id} was not paused")


def _schedule_dict(row: ScheduleRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "job_name": row.job_name,
        "cron": row.cron,
        "every": row.every.total_seconds() if row.every is not None else None,
        "tz": row.tz,
        "paused": row.paused,
        "orphaned": row.orphaned,
        "next_run_at": row.next_run_at.isoformat(),
        "last_run_at": row.last_run_at.isoformat() if row.last_run_at else None,
    }
