"""``flask defer status`` (health, with thresholds for monitoring) and ``run-due`` (cron)."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta

import click
from flask.cli import with_appcontext

from ..facade import current_defer
from .common import CLI_ACTOR, errors_to_exit_codes


@click.command("status", short_help="Show counts by status and the backlog.")
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
@errors_to_exit_codes
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
        if health.undeclared_schedules:
            # Schedules nobody ticks: gone from the code, or their release is not running.
            click.echo(
                "schedules not declared by running code: "
                + ", ".join(health.undeclared_schedules)
            )
        if health.paused:
            # Their jobs wait, pending (and owed once due), until resumed.
            click.echo("paused: " + ", ".join(health.paused))
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


@click.command("run-due", short_help="Run the jobs due now, then exit (for cron).")
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
@errors_to_exit_codes
def run_due_command(ahead: float, max_seconds: float | None) -> None:
    """Run every job that is due now, in this process, then exit (for cron).

    First returns jobs whose lease lapsed (a run that was killed) to pending, and keeps
    the leases of the jobs it runs renewed, as a worker does: cron alone is enough,
    and a worker beside it never runs a job twice.
    """
    now = datetime.now(UTC) + timedelta(seconds=ahead)
    summary = current_defer().run_due(now=now, max_seconds=max_seconds, actor=CLI_ACTOR)
    parts = ", ".join(f"{name} {n}" for name, n in summary.counts.items() if n)
    click.echo(f"ran {summary.ran} job(s)" + (f": {parts}" if parts else ""))
    if summary.out_of_time:
        click.echo(f"stopped after --max-seconds {max_seconds:g}; more may be due")
