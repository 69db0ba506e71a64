"""``flask defer workers``: who is running, serving which queues, holding which jobs."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime
from typing import Any

import click
from flask.cli import with_appcontext

from ..facade import current_defer
from ..store import WorkerInfo
from ..timeutil import utcnow
from .common import errors_to_exit_codes


def _as_json(info: WorkerInfo) -> dict[str, Any]:
    data = asdict(info)
    for name, value in data.items():
        if isinstance(value, datetime):
            data[name] = value.isoformat()
        elif isinstance(value, tuple):
            data[name] = list(value)
    return data


@click.command("workers", short_help="List the live workers (and the stale ones).")
@click.option(
    "--json", "as_json", is_flag=True, help="Print a JSON array of the workers ([] when none)."
)
@with_appcontext
@errors_to_exit_codes
def workers_command(as_json: bool) -> None:
    """List every worker: host and pid, queues, threads, jobs it holds, last heartbeat.

    A worker is stale after two missed heartbeats (killed, or cut off from the
    database); its row is deleted a day later.
    """
    found = current_defer().workers()
    if as_json:
        click.echo(json.dumps([_as_json(info) for info in found], indent=2))
        return
    if not found:
        click.echo("no workers")
        return
    now = utcnow()
    for info in found:
        queues = ",".join(info.queues) if info.queues else "all queues"
        seen = (now - info.last_seen).total_seconds()
        state = "STALE" if info.stale else "live"
        listen = {True: ", LISTEN", False: ", deaf LISTEN (polling)", None: ""}[info.listening]
        click.echo(
            f"{info.id}  {state}  {info.kind}  {queues}  {info.concurrency} thread(s)"
            f"  running {len(info.running)}  seen {seen:.0f} s ago{listen}"
        )
