"""``flask defer list | cancel | retry | prune``: look at jobs and act on them."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import click
from flask.cli import with_appcontext

from ..errors import JobNotPending
from ..facade import current_defer
from ..jobs import Job, JobStatus
from .common import CLI_ACTOR, errors_to_exit_codes


@click.command("list")
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
@click.option(
    "--json", "as_json", is_flag=True, help="Print a JSON array of the jobs ([] when none)."
)
@with_appcontext
@errors_to_exit_codes
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
        # One array, so an empty list is still valid JSON (`[]`) for `jq` and scripts.
        click.echo(json.dumps([_job_dict(job) for job in jobs], indent=2))
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


def _job_dict(job: Job) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for name in Job.__slots__:
        value = getattr(job, name)
        data[name] = value.isoformat() if isinstance(value, datetime) else value
    data["status"] = job.status.value
    return data


@click.command("cancel", short_help="Cancel a job by id, --key or --key-prefix.")
@click.argument("job_id", type=int, required=False)
@click.option("--key", default=None, help="Cancel the live job holding this key.")
@click.option("--key-prefix", default=None, help="Cancel every pending job under this prefix.")
@with_appcontext
@errors_to_exit_codes
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


@click.command("abort", short_help="Stop a job: cancel it if pending, else ask its worker.")
@click.argument("job_id", type=int)
@with_appcontext
@errors_to_exit_codes
def abort_command(job_id: int) -> None:
    """Stop job JOB_ID: cancel it while pending; while running, ask its worker to stop
    it (its handler sees ``job.abort_requested()`` within a heartbeat).

    Exits 1 when no job has this id, when it has settled already, or when its abort was
    asked for before.
    """
    defer = current_defer()
    if defer.abort(job_id, actor=CLI_ACTOR):
        job = defer.get(job_id)
        if job is not None and job.status is JobStatus.CANCELLED:
            click.echo(f"cancelled job {job_id}")
        else:
            click.echo(f"abort requested for job {job_id}: its worker stops it at its next look")
        return
    job = defer.get(job_id)
    status = job.status.value if job is not None else "gone"
    if job is not None and job.abort_requested_by is not None and job.is_live:
        raise click.ClickException(
            f"not aborted: job {job_id} is {status}, abort already requested by "
            f"{job.abort_requested_by}"
        )
    raise click.ClickException(f"not aborted: job {job_id} is {status}")


@click.command("retry", short_help="Put a failed job back to pending, due now.")
@click.argument("job_id", type=int)
@with_appcontext
@errors_to_exit_codes
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


@click.command("prune", short_help="Delete settled jobs past their retention.")
@with_appcontext
@errors_to_exit_codes
def prune_command() -> None:
    """Delete settled jobs past DEFER_RETENTION (failed: DEFER_FAILED_RETENTION)."""
    deleted = current_defer().prune()
    click.echo(f"pruned {deleted} settled job(s)")
