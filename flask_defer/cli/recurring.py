"""``flask defer schedules [pause | resume | forget]``: the recurring schedules."""

from __future__ import annotations

import json
from typing import Any

import click
from flask.cli import with_appcontext

from ..facade import current_defer
from ..store.recurring_statements import ScheduleRow
from .common import errors_to_exit_codes


@click.group("schedules", invoke_without_command=True)
@click.option(
    "--json", "as_json", is_flag=True, help="Print a JSON array of the schedules ([] when none)."
)
@click.pass_context
@with_appcontext
@errors_to_exit_codes
def schedules_command(ctx: click.Context, as_json: bool) -> None:
    """List recurring schedules; pause, resume or forget one."""
    if ctx.invoked_subcommand is not None:
        return
    rows = current_defer().list_recurring()
    if as_json:
        # One array, like `flask defer list --json`: an empty list prints `[]`.
        click.echo(json.dumps([_schedule_dict(row) for row in rows], indent=2))
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
@errors_to_exit_codes
def schedules_pause_command(schedule_id: str) -> None:
    """Stop a schedule from ticking until it is resumed."""
    if current_defer().pause_recurring(schedule_id):
        click.echo(f"schedule {schedule_id} paused")
    else:
        click.echo(f"schedule {schedule_id} was already paused")


@schedules_command.command("resume")
@click.argument("schedule_id")
@with_appcontext
@errors_to_exit_codes
def schedules_resume_command(schedule_id: str) -> None:
    """Let a paused schedule tick again, from its next tick (missed ones are not run)."""
    if current_defer().resume_recurring(schedule_id):
        click.echo(f"schedule {schedule_id} resumed")
    else:
        click.echo(f"schedule {schedule_id} was not paused")


@schedules_command.command("forget")
@click.argument("schedule_id")
@with_appcontext
@errors_to_exit_codes
def schedules_forget_command(schedule_id: str) -> None:
    """Orphan a schedule removed from the code now (else after DEFER_SCHEDULE_ORPHAN_GRACE)."""
    if current_defer().forget_recurring(schedule_id):
        click.echo(f"schedule {schedule_id} forgotten: orphaned, it no longer ticks")
    else:
        click.echo(f"schedule {schedule_id} was already orphaned")


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
        "declared_at": row.declared_at.isoformat() if row.declared_at else None,
    }
