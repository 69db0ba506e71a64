"""``flask defer ...``: thin click commands over the facade, one module a command group.

Each command parses its options, calls one facade method, and prints the result. Only
here do errors become exit codes: 1 for a refused operation, 2 for bad input
(:mod:`.common`). The commands: ``install`` and ``db`` (:mod:`.schema`); ``list``,
``cancel``, ``abort``, ``retry``, ``prune`` (:mod:`.jobs`); ``status`` and ``run-due``
(:mod:`.status`); ``worker`` (:mod:`.worker`); ``schedules`` (the recurring
schedules, :mod:`.recurring`); ``pause``, ``resume`` and ``paused`` (:mod:`.pauses`);
``workers`` and ``explain`` (:mod:`.workers`).
"""

from __future__ import annotations

import click

from . import jobs, pauses, recurring, schema, status, worker, workers


@click.group("defer")
def defer_cli() -> None:
    """Durable delayed jobs: install, inspect, cancel and run them."""


for _command in (
    schema.install_command,
    schema.db_cli,
    jobs.list_command,
    jobs.cancel_command,
    jobs.abort_command,
    status.status_command,
    status.run_due_command,
    worker.worker_command,
    jobs.prune_command,
    jobs.retry_command,
    recurring.schedules_command,
    pauses.pause_command,
    pauses.resume_command,
    pauses.paused_command,
    workers.workers_command,
    workers.explain_command,
):
    defer_cli.add_command(_command)

__all__ = ["defer_cli"]
