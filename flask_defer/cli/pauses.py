"""``flask defer pause | resume | paused``: stop and restart a queue or a job name."""

from __future__ import annotations

import json
from dataclasses import asdict

import click
from flask.cli import with_appcontext

from ..facade import current_defer
from .common import CLI_ACTOR, errors_to_exit_codes

_QUEUE = click.option("--queue", default=None, help="The queue (as in @defer.job(queue=...)).")
_NAME = click.option("--name", default=None, help="The job name (every queue).")


def _what(queue: str | None, name: str | None) -> str:
    return f"queue {queue}" if queue is not None else f"job name {name}"


@click.command("pause", short_help="Stop workers from starting jobs of a queue or name.")
@_QUEUE
@_NAME
@with_appcontext
@errors_to_exit_codes
def pause_command(queue: str | None, name: str | None) -> None:
    """Pause a queue (--queue) or a job name (--name): its jobs wait, pending.

    Running jobs finish; the waiting ones keep their run time and count as owed once
    due. Give exactly one of the two options.
    """
    if current_defer().pause(queue, name, actor=CLI_ACTOR):
        click.echo(f"{_what(queue, name)} paused")
    else:
        click.echo(f"{_what(queue, name)} was already paused")


@click.command("resume", short_help="Let workers start jobs of a paused queue or name.")
@_QUEUE
@_NAME
@with_appcontext
@errors_to_exit_codes
def resume_command(queue: str | None, name: str | None) -> None:
    """Resume a paused queue (--queue) or job name (--name): its due jobs start now."""
    if current_defer().resume(queue, name, actor=CLI_ACTOR):
        click.echo(f"{_what(queue, name)} resumed")
    else:
        click.echo(f"{_what(queue, name)} was not paused")


@click.command("paused", short_help="List the paused queues and job names.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print a JSON array of the pauses ([] when none)."
)
@with_appcontext
@errors_to_exit_codes
def paused_command(as_json: bool) -> None:
    """List the paused queues and job names, with when and by whom."""
    pauses = current_defer().paused()
    if as_json:
        rows = [{**asdict(p), "paused_at": p.paused_at.isoformat()} for p in pauses]
        click.echo(json.dumps(rows, indent=2))
        return
    if not pauses:
        click.echo("nothing is paused")
    for p in pauses:
        click.echo(f"{p.kind:<6}{p.value}  paused {p.paused_at.isoformat()} by {p.actor}")
