"""``flask defer workers``: who is running, serving which queues, holding which jobs;
``flask defer explain``: why a job has not started."""

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


@click.command("explain", short_help="Say why a pending job has not started.")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of the reasons.")
@with_appcontext
@errors_to_exit_codes
def explain_command(job_id: int, as_json: bool) -> None:
    """Every reason pending job JOB_ID has not started: not due yet, paused, waiting for
    parents, a concurrency key at its limit, a rate limit used up, no live worker for
    its queue or its name, expired. Exits 1 when no job has the id."""
    defer = current_defer()
    reasons = defer.explain(job_id)
    if as_json:
        rows = [
            {**asdict(r), **{k: getattr(r, k).isoformat() for k in ("until", "since")
                             if getattr(r, k) is not None}, "job_ids": list(r.job_ids)}
            for r in reasons
        ]  # fmt: skip
        click.echo(json.dumps(rows, indent=2))
        return
    if not reasons:
        job = defer.get(job_id)
        status = job.status.value if job is not None else "gone"
        click.echo(f"job {job_id} is {status}: nothing holds it back" if status == "pending"
                   else f"job {job_id} is {status}, not waiting")  # fmt: skip
        return
    for reason in reasons:
        click.echo(f"{reason.code}: {reason.text}")
